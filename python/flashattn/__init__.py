"""flashattn: stub"""
from . import _C
