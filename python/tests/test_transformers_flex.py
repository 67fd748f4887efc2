"""test_transformers_flex.py: attn_implementation="flex_attention" routed to flashattn.

flashattn.transformers.route_flex_attention() puts flashattn.flex_attention behind
transformers' "flex_attention" (transformers still builds the BlockMask). A tiny
randomly initialised Llama (nothing downloaded; HF_HUB_OFFLINE=1) is run against the
same weights on transformers' "sdpa": logits with and without left padding, three
AdamW steps (torch's own flex has no CPU backward, so this trains only when routed),
greedy generate() with the KV cache; stats() shows flashattn ran with no fallback.
"""

import copy

import pytest

from conftest import needs_torch, torch

pytestmark = needs_torch
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("torch.nn.attention.flex_attention", reason="torch without flex_attention")

import flashattn.torch as fat  # noqa: E402
import flashattn.transformers as fht  # noqa: E402


@pytest.fixture(autouse=True)
def routed():
    fht.route_flex_attention(True)
    yield
    fht.route_flex_attention(False)


def _pair(dtype=torch.float32):
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   attention_dropout=0.0)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa", torch_dtype=dtype)
    flex = transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="flex_attention",
                                                      torch_dtype=dtype)
    flex.load_state_dict(ref.state_dict())
    assert flex.config._attn_implementation == "flex_attention"
    return ref, flex


def _ran(min_calls):
    s = fat.stats()
    assert s["routed"] >= min_calls and not s["fallbacks"], s


def test_route_and_unroute():
    from transformers import AttentionInterface

    assert AttentionInterface._global_mapping["flex_attention"] is fht.flex_attention_forward
    fht.route_flex_attention(False)
    assert AttentionInterface._global_mapping["flex_attention"] is not fht.flex_attention_forward
    fht.route_flex_attention(True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logits_match_sdpa(dtype):
    dt = getattr(torch, dtype)
    ref, model = _pair(dt)
    ref.eval()
    model.eval()
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    pad = torch.ones(2, 24, dtype=torch.long)
    pad[1, :5] = 0
    with torch.no_grad():
        want = ref(ids).logits.double()
        want_pad = ref(ids, attention_mask=pad).logits.double()
        fat.reset_stats()
        got = model(ids).logits.double()
        got_pad = model(ids, attention_mask=pad).logits.double()
        _ran(4)
    tol = 1e-5 if dt == torch.float32 else 3e-2
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= tol * scale
    assert (got_pad[0] - want_pad[0]).abs().max().item() <= tol * scale
    assert (got_pad[1, 5:] - want_pad[1, 5:]).abs().max().item() <= tol * scale


def test_three_optimizer_steps_match():
    ref, model = _pair()
    gen = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, 96, (2, 40), generator=gen) for _ in range(3)]
    losses = []
    for m in (ref, model):
        m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        run = []
        fat.reset_stats()
        for ids in batches:
            opt.zero_grad()
            loss = m(ids, labels=ids).loss
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    _ran(6)
    for a, b in zip(*losses):
        assert abs(a - b) <= 1e-5 * abs(a), losses
    assert losses[0][0] != losses[0][2]


def test_greedy_generate_same_tokens():
    ref, model = _pair()
    ref.eval()
    model.eval()
    ids = torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=8, do_sample=False, use_cache=True, attention_mask=torch.ones_like(ids), pad_token_id=0)
    want = ref.generate(ids, **kw)
    fat.reset_stats()
    got = model.generate(ids, **kw)
    _ran(8)
    assert torch.equal(got, want)
