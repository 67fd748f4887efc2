// binding.cpp: the compiled module flashattn._C, a thin nanobind layer over
// include/flashattn.h.
//
// It owns three things and nothing else:
//  - turning any array that speaks DLPack or the buffer protocol (NumPy, PyTorch,
//    JAX) into an fa_tensor with its real strides, without a copy;
//  - calling fa_forward / fa_backward / fa_merge_states / fa_tune with the GIL released,
//    and fa_forward_work (a call's kept pairs and FLOPs) on the same arguments;
//  - turning every fa_status into a Python exception that carries
//    fa_context_error()'s words.
// It does not allocate outputs: the Python layer (flashattn/_core.py) allocates them
// with the caller's framework and passes them in, so the binding stays one
// code path for every framework. The one exception is forward_torch, the torch
// inference fast path, which has torch allocate its output through a function
// handed over from Python (torch_setup). Shapes are checked by the library itself.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <memory>

#include <flashattn.h>

#include <chrono>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace {

// Inputs are read-only views; outputs need write access. Any device is accepted at
// the type level so that a CUDA tensor gets our ValueError, not an overload error.
using in_array = nb::ndarray<nb::ro>;
using out_array = nb::ndarray<>;

[[noreturn]] void raise(PyObject *type, const std::string &msg)
{
    PyErr_SetString(type, msg.c_str());
    throw nb::python_error();
}

// The exception class of a status (issue 12: ValueError for what the caller got
// wrong, MemoryError, RuntimeError for the rest; NotImplementedError, a
// RuntimeError, for a form the chosen algorithm does not run).
PyObject *exception_of(fa_status st)
{
    switch (st) {
    case FA_ERR_NULL_POINTER:
    case FA_ERR_STRUCT_SIZE:
    case FA_ERR_INVALID_DIM:
    case FA_ERR_SHAPE_MISMATCH:
    case FA_ERR_HEAD_RATIO:
    case FA_ERR_DTYPE:
    case FA_ERR_OVERFLOW:
    case FA_ERR_BROADCAST:
    case FA_ERR_INVALID_ARGUMENT:
    case FA_ERR_OUT_OF_RANGE:
        return PyExc_ValueError;
    case FA_ERR_OUT_OF_MEMORY:
        return PyExc_MemoryError;
    case FA_ERR_IO:
        return PyExc_OSError;
    case FA_ERR_UNSUPPORTED:
        // the chosen algorithm cannot run this form; a RuntimeError subclass
        return PyExc_NotImplementedError;
    default:
        return PyExc_RuntimeError;
    }
}

void check(fa_status st, const fa_context *ctx, const char *what)
{
    if (st == FA_OK)
        return;
    std::string msg = std::string(what) + ": " + fa_status_string(st);
    // A busy context did not write its message (it belongs to the other thread).
    const char *detail = (ctx && st != FA_ERR_BUSY) ? fa_context_error(ctx) : "";
    if (detail && *detail)
        msg += ": " + std::string(detail);
    if (st == FA_ERR_BUSY)
        msg += " (a flashattn.Context serves one thread at a time; give each thread its own)";
    raise(exception_of(st), msg);
}

// The owner of one fa_context. Python's Context class wraps it.
struct Context {
    fa_context *ctx = nullptr;
    explicit Context(int64_t threads, int64_t algo)
    {
        check(fa_context_create(&ctx), nullptr, "fa_context_create");
        fa_status st = fa_context_set(ctx, FA_PARAM_THREADS, threads);
        if (st == FA_OK)
            st = fa_context_set(ctx, FA_PARAM_ALGO, algo);
        if (st != FA_OK) {
            std::string msg = std::string("flashattn.Context: ") + fa_status_string(st) + ": " + fa_context_error(ctx);
            fa_context_free(ctx);
            ctx = nullptr;
            raise(exception_of(st), msg);
        }
    }
    ~Context() { fa_context_free(ctx); }
    Context(const Context &) = delete;
    Context &operator=(const Context &) = delete;
    fa_context *get() const
    {
        if (!ctx)
            raise(PyExc_ValueError, "flashattn.Context is closed");
        return ctx;
    }
};

fa_dtype dtype_of(const nb::dlpack::dtype &t, const char *name, bool allow_bool, bool allow_i8)
{
    using code = nb::dlpack::dtype_code;
    const auto c = static_cast<code>(t.code);
    if (t.lanes == 1) {
        if (c == code::Float && t.bits == 32)
            return FA_DTYPE_F32;
        if (c == code::Float && t.bits == 16)
            return FA_DTYPE_F16;
        if (c == code::Bfloat && t.bits == 16)
            return FA_DTYPE_BF16;
        if (allow_bool && t.bits == 8 && (c == code::Bool || c == code::UInt))
            return FA_DTYPE_BOOL;
        if (allow_i8 && c == code::Int && t.bits == 8)
            return FA_DTYPE_I8;
        // DLPack's kDLFloat8_e4m3fn (10) and kDLFloat8_e5m2 (12): torch.float8_e4m3fn, torch.float8_e5m2
        if (allow_i8 && t.code == 10 && t.bits == 8)
            return FA_DTYPE_F8E4M3;
        if (allow_i8 && t.code == 12 && t.bits == 8)
            return FA_DTYPE_F8E5M2;
    }
    raise(PyExc_ValueError, std::string(name) + ": unsupported dtype (code " + std::to_string(t.code) + ", " +
                                std::to_string(t.bits) + " bits); flashattn takes float32, float16 or bfloat16" +
                                (allow_bool ? " (or bool for a mask)" : "") + (allow_i8 ? " (or int8, float8_e4m3fn, float8_e5m2 for a cache)" : ""));
}

template <typename A> void check_cpu(const A &a, const char *name)
{
    if (a.device_type() != nb::device::cpu::value)
        raise(PyExc_ValueError, std::string(name) + " is not on the CPU (DLPack device type " +
                                    std::to_string(a.device_type()) + "); flashattn runs on CPU tensors only");
}

// tensor_from: a 4-d fa_tensor over an imported array's memory and strides
// (elements); tensor_of: the same from any Python array, or an absent one for None.
// lse (B, H, S) and int8 scales (N, S, Hk) may come 3-d: the library's trailing
// extent of 1 is added here, which saves the caller a view per call.
//
// bnsd: the array is (batch, nheads, seqlen, dim), PyTorch SDPA's layout, or 3-d
// (batch, seqlen, dim) with one head; axes 1 and 2 are swapped here, in the strides,
// which saves the SDPA wrapper a transposed view per tensor per call (~1 us each;
// forward_torch only).
template <typename A>
fa_tensor tensor_from(const A &a, const char *name, bool allow_bool = false, bool allow_i8 = false,
                      bool allow_3d = false, bool bnsd = false)
{
    fa_tensor t;
    std::memset(&t, 0, sizeof t);
    check_cpu(a, name);
    const size_t nd = a.ndim();
    if (nd != 4 && !((allow_3d || bnsd) && nd == 3))
        raise(PyExc_ValueError, std::string(name) + " must be " + (allow_3d || bnsd ? "3-d or " : "") + "4-d, got " +
                                    std::to_string(nd) + "-d");
    t.data = const_cast<void *>(static_cast<const void *>(a.data()));
    t.dtype = dtype_of(a.dtype(), name, allow_bool, allow_i8);
    if (bnsd) {
        // (B, H, S, D) -> (B, S, H, D); a 3-d (B, S, D) is (B, S, 1, D)
        const bool three = nd == 3;
        const size_t from[4] = {0, three ? 1u : 2u, three ? 3u : 1u, three ? 2u : 3u};
        for (size_t i = 0; i < 4; i++) {
            const size_t j = from[i];
            t.shape[i] = j < nd ? static_cast<int64_t>(a.shape(j)) : 1;
            t.stride[i] = j < nd ? a.stride(j) : 1;
        }
    } else {
        for (size_t i = 0; i < 4; i++) {
            t.shape[i] = i < nd ? static_cast<int64_t>(a.shape(i)) : 1;
            t.stride[i] = i < nd ? a.stride(i) : 1;
        }
    }
    // The library needs a data pointer even for an empty tensor.
    if (!t.data)
        t.data = &t;
    return t;
}

// The arrays a call reads and writes, held until the call is over. An ndarray made
// from a DLPack capsule owns the capsule's tensor (nanobind consumes the capsule), so
// when the capsule was the only reference, as for `to_dlpack(x.contiguous())`, the
// tensor's memory lives exactly as long as that ndarray: it must outlive fa_forward,
// not just the conversion.
struct Keep {
    std::vector<in_array> in;
    std::vector<out_array> out;
    Keep()
    {
        // one allocation each for any call but a merge of many parts (a call costs ~1 us)
        in.reserve(12);
        out.reserve(8);
    }
    void hold(const in_array &a) { in.push_back(a); }
    void hold(const out_array &a) { out.push_back(a); }
};

template <typename A>
fa_tensor tensor_of(Keep &keep, const nb::handle &obj, const char *name, bool allow_bool = false,
                    bool allow_i8 = false, bool allow_3d = false)
{
    if (obj.is_none()) {
        fa_tensor t;
        std::memset(&t, 0, sizeof t);
        return t;
    }
    A a;
    if (!nb::try_cast(obj, a))
        raise(PyExc_TypeError, std::string(name) + ": expected an array (DLPack or buffer protocol)" +
                                   (std::is_same<A, out_array>::value ? ", writable" : "") + ", got " +
                                   nb::type_name(obj.type()).c_str());
    keep.hold(a);
    return tensor_from(a, name, allow_bool, allow_i8, allow_3d);
}

// An optional array argument as an imported CPU array held for the call: false for
// None; TypeError when obj is no array (`what` says which kind was expected).
bool host_array(Keep &keep, const nb::handle &obj, const char *name, const char *what, in_array &a)
{
    if (obj.is_none())
        return false;
    if (!nb::try_cast(obj, a))
        raise(PyExc_TypeError, std::string(name) + ": expected " + what);
    keep.hold(a);
    check_cpu(a, name);
    return true;
}

// A contiguous 1-d (or row-major 2-d) int32 array for cu_seqlens, seqlens,
// batch_idx and block tables; its pointer, or NULL for None.
const int32_t *int32_of(Keep &keep, const nb::handle &obj, const char *name, int64_t *rows = nullptr,
                        int64_t *cols = nullptr)
{
    in_array a;
    if (!host_array(keep, obj, name, "an int32 array", a))
        return nullptr;
    const auto t = a.dtype();
    if (t.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Int) || t.bits != 32 || t.lanes != 1)
        raise(PyExc_ValueError, std::string(name) + " must be int32");
    if (a.ndim() == 1) {
        if (a.shape(0) > 1 && a.stride(0) != 1)
            raise(PyExc_ValueError, std::string(name) + " must be contiguous");
        if (rows)
            *rows = 1;
        if (cols)
            *cols = static_cast<int64_t>(a.shape(0));
    } else if (a.ndim() == 2 && cols) {
        if ((a.shape(1) > 1 && a.stride(1) != 1) || (a.shape(0) > 1 && a.stride(0) != (int64_t)a.shape(1)))
            raise(PyExc_ValueError, std::string(name) + " must be contiguous (row-major)");
        *rows = static_cast<int64_t>(a.shape(0));
        *cols = static_cast<int64_t>(a.shape(1));
    } else {
        raise(PyExc_ValueError, std::string(name) + " must be 1-d" + (cols ? " or 2-d" : ""));
    }
    static const int32_t empty = 0;
    return a.data() ? static_cast<const int32_t *>(a.data()) : &empty;
}

// A contiguous 1-d float32 array of exactly n values (sinks, and the backward's
// dsinks output: one per query head; the library's plain pointer carries no length,
// so it is checked here); its pointer, or NULL for None.
float *floats_of(Keep &keep, const nb::handle &obj, const char *name, int64_t n)
{
    in_array a;
    if (!host_array(keep, obj, name, "a float32 array", a))
        return nullptr;
    const auto t = a.dtype();
    if (t.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Float) || t.bits != 32 || a.ndim() != 1 ||
        static_cast<int64_t>(a.shape(0)) != n || (n > 1 && a.stride(0) != 1))
        raise(PyExc_ValueError, std::string(name) + " must be a contiguous float32 array of nheads = " +
                                    std::to_string(n) + " values");
    return const_cast<float *>(static_cast<const float *>(a.data()));
}

// Everything fa_forward_args holds besides the data, kept alive for one call.
// The library's init functions rather than the INIT macros: C++ warns about their
// brace-elided {0} members.
struct Call {
    fa_forward_args a;
    fa_kv_cache cache;
    fa_block_mask block_mask;
    fa_backward_args b;
    Keep keep;
    Call()
    {
        fa_forward_args_init(&a);
        fa_kv_cache_init(&cache);
        fa_block_mask_init(&block_mask);
        fa_backward_args_init(&b);
    }
};

// ---------------------------------------------------------------- the call's keywords
// Every keyword of forward, forward_work, backward, tune and time_call_c is a row of the
// header's field tables (FA_FORWARD_FIELDS, then FA_KV_CACHE_FIELDS, then
// FA_BACKWARD_FIELDS), under its key; opts, a tuple of the forward's OPTION rows in the
// table's order (flashattn's Options, built from fa_args_field), sets those at once, and
// a keyword overrides it. Up to five arrays may come by position: q, k, v, out,
// softmax_lse. So a field added to a table is a keyword here, and an OPTION row a member
// of Options, with no line of this file changed.
enum Key : int {
#define KEY_FWD(name, ...) FWD_##name,
#define KEY_KV(name, ...) KV_##name,
#define KEY_BWD(name, ...) BWD_##name,
    FA_FORWARD_FIELDS(KEY_FWD) FA_KV_CACHE_FIELDS(KEY_KV) FA_BACKWARD_FIELDS(KEY_BWD) N_KEYS
#undef KEY_FWD
#undef KEY_KV
#undef KEY_BWD
};

enum Part { FWD, KV, BWD }; // the struct a row belongs to

struct KeyRow {
    const char *key;
    fa_field_type type;
    fa_field_role role;
    Part part;
    size_t offset;
};

const KeyRow g_rows[N_KEYS] = {
#define ROW_OF(S, P, name, key, ctype, type, role, def, doc) {key, FA_FIELD_##type, FA_ROLE_##role, P, offsetof(S, name)},
#define ROW_FWD(...) ROW_OF(fa_forward_args, FWD, __VA_ARGS__)
#define ROW_KV(...) ROW_OF(fa_kv_cache, KV, __VA_ARGS__)
#define ROW_BWD(...) ROW_OF(fa_backward_args, BWD, __VA_ARGS__)
    FA_FORWARD_FIELDS(ROW_FWD) FA_KV_CACHE_FIELDS(ROW_KV) FA_BACKWARD_FIELDS(ROW_BWD)
#undef ROW_OF
#undef ROW_FWD
#undef ROW_KV
#undef ROW_BWD
};

// A row a caller gives: data or an option (the header, the derived extents and the
// pointers to other structs are the binding's to fill; of those, block_mask comes as
// a keyword too, a tuple: fill_block_mask).
bool is_keyword(const KeyRow &r)
{
    return r.role == FA_ROLE_INPUT || r.role == FA_ROLE_OUTPUT || r.role == FA_ROLE_INOUT ||
           r.role == FA_ROLE_OPTION;
}

// The forward's OPTION rows in table order: the members of an opts tuple.
struct OptionKeys {
    int key[N_KEYS];
    int n = 0;
    OptionKeys()
    {
        for (int i = 0; i < N_KEYS; i++)
            if (g_rows[i].part == FWD && g_rows[i].role == FA_ROLE_OPTION)
                key[n++] = i;
    }
};
const OptionKeys g_options;

PyObject *g_key_names[N_KEYS]; // interned at import: most keywords compare by pointer
PyObject *g_opts_name = nullptr;

// The Python objects of one call's keywords; null = not given.
struct Args {
    PyObject *h[N_KEYS] = {};
    nb::handle operator[](int k) const { return h[k] ? nb::handle(h[k]) : nb::handle(Py_None); }
};

[[noreturn]] void bad_keyword(const char *what, nb::handle name)
{
    raise(PyExc_TypeError, std::string(what) + "() got an unexpected keyword argument " +
                               nb::cast<std::string>(nb::repr(name)));
}

// opts (a tuple, one value per OPTION row) into args; None = the defaults.
void take_options(Args &args, nb::handle opts, const char *what)
{
    if (opts.is_none())
        return;
    if (!PyTuple_Check(opts.ptr()) || PyTuple_GET_SIZE(opts.ptr()) != g_options.n)
        raise(PyExc_TypeError, std::string(what) + ": opts must be a flashattn Options (a tuple of " +
                                   std::to_string(g_options.n) + " values)");
    for (int i = 0; i < g_options.n; i++)
        args.h[g_options.key[i]] = PyTuple_GET_ITEM(opts.ptr(), i);
}

// Positional: the arrays q, k, v, out, softmax_lse, then opts (by position it costs a
// small call no keyword dict); then every other keyword (the backward's own only for
// backward), which overrides opts.
Args parse(const nb::args &pos, const nb::kwargs &kw, const char *what, bool backward = false)
{
    Args args;
    static const int positional[] = {FWD_q, FWD_k, FWD_v, FWD_o, FWD_lse};
    const size_t n_arrays = sizeof positional / sizeof *positional, np = pos.size();
    if (np > n_arrays + 1)
        raise(PyExc_TypeError, std::string(what) + "() takes at most q, k, v, out, softmax_lse and opts by position");
    for (size_t i = 0; i < np && i < n_arrays; i++)
        args.h[positional[i]] = PyTuple_GET_ITEM(pos.ptr(), static_cast<Py_ssize_t>(i));
    PyObject *opts = np > n_arrays ? PyTuple_GET_ITEM(pos.ptr(), n_arrays) : PyDict_GetItem(kw.ptr(), g_opts_name);
    if (opts)
        take_options(args, opts, what);
    PyObject *name, *value;
    Py_ssize_t at = 0;
    while (PyDict_Next(kw.ptr(), &at, &name, &value)) {
        if (name == g_opts_name)
            continue;
        int found = -1;
        for (int i = 0; i < N_KEYS && found < 0; i++)
            if (name == g_key_names[i])
                found = i;
        for (int i = 0; i < N_KEYS && found < 0; i++)
            if (g_key_names[i] && PyUnicode_Compare(name, g_key_names[i]) == 0)
                found = i;
        if (found < 0) {
            if (PyErr_Occurred())
                throw nb::python_error();
            if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "opts") == 0)
                continue;
            bad_keyword(what, name);
        }
        if (g_rows[found].part == BWD && !backward)
            bad_keyword(what, name);
        args.h[found] = value;
    }
    return args;
}

template <typename T> void store(char *at, T x)
{
    std::memcpy(at, &x, sizeof x);
}

// A scalar option into its field, converted as its type says.
void set_scalar(void *base, const KeyRow &r, nb::handle v)
{
    char *at = static_cast<char *>(base) + r.offset;
    PyObject *o = v.ptr();
    auto fail = [&r](const char *want) {
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_OverflowError))
            throw nb::python_error();
        PyErr_Clear();
        raise(PyExc_TypeError, std::string(r.key) + " must be " + want);
    };
    switch (r.type) {
    case FA_FIELD_F32: {
        const double d = PyFloat_AsDouble(o);
        if (d == -1.0 && PyErr_Occurred())
            fail("a number");
        store(at, static_cast<float>(d));
        break;
    }
    case FA_FIELD_I32:
    case FA_FIELD_I64: {
        const bool i32 = r.type == FA_FIELD_I32;
        const long long x = PyLong_AsLongLong(o);
        if ((x == -1 && PyErr_Occurred()) || (i32 && (x < INT32_MIN || x > INT32_MAX)))
            fail(i32 ? "an int32" : "an int64");
        if (i32)
            store(at, static_cast<int32_t>(x));
        else
            store(at, static_cast<int64_t>(x));
        break;
    }
    case FA_FIELD_U32:
    case FA_FIELD_U64: {
        const bool u32 = r.type == FA_FIELD_U32;
        const unsigned long long x = PyLong_AsUnsignedLongLong(o);
        if ((x == static_cast<unsigned long long>(-1) && PyErr_Occurred()) || (u32 && x > UINT32_MAX))
            fail(u32 ? "a uint32" : "a uint64");
        if (u32)
            store(at, static_cast<uint32_t>(x));
        else
            store(at, static_cast<uint64_t>(x));
        break;
    }
    default:
        raise(PyExc_TypeError, std::string(r.key) + ": not a scalar");
    }
}

void *base_of(Call &c, Part p)
{
    return p == FWD ? static_cast<void *>(&c.a) : p == KV ? static_cast<void *>(&c.cache) : static_cast<void *>(&c.b);
}

// The binding's conveniences for arrays: which take bool (masks) or quantised codes
// (caches), and which may come 3-d with the library's trailing extent of 1 left out.
void array_rules(int key, bool *allow_bool, bool *allow_i8, bool *allow_3d)
{
    *allow_bool = key == FWD_mask || key == FWD_dropout_mask;
    *allow_i8 = key == KV_k || key == KV_v;
    *allow_3d = key == FWD_lse || key == KV_k_scale || key == KV_v_scale;
}

// The tensors and options of one struct (part) from args, by the table.
void fill_part(Call &c, const Args &args, Part part)
{
    void *base = base_of(c, part);
    for (int i = 0; i < N_KEYS; i++) {
        const KeyRow &r = g_rows[i];
        if (r.part != part || !args.h[i])
            continue;
        if (r.role == FA_ROLE_OPTION) {
            if (args.h[i] != Py_None) // None: the default
                set_scalar(base, r, args[i]);
        } else if (r.type == FA_FIELD_TENSOR) {
            bool b, q8, d3;
            array_rules(i, &b, &q8, &d3);
            const fa_tensor t = r.role == FA_ROLE_INPUT ? tensor_of<in_array>(c.keep, args[i], r.key, b, q8, d3)
                                                        : tensor_of<out_array>(c.keep, args[i], r.key, b, q8, d3);
            std::memcpy(static_cast<char *>(base) + r.offset, &t, sizeof t);
        }
    }
}

// A contiguous 1-d array of one integer type (code, bits) for the block mask's
// plain pointers; its pointer and length, or NULL for None.
const void *flat_of(Keep &keep, const nb::handle &obj, const char *name, nb::dlpack::dtype_code code, int bits,
                    int64_t *n)
{
    *n = 0;
    if (obj.is_none())
        return nullptr;
    const char *want = code == nb::dlpack::dtype_code::UInt ? (bits == 8 ? "uint8" : "unsigned")
                                                             : (bits == 32 ? "int32" : "int64");
    in_array a;
    if (!nb::try_cast(obj, a))
        raise(PyExc_TypeError, std::string(name) + ": expected a " + want + " array");
    keep.hold(a);
    check_cpu(a, name);
    const auto t = a.dtype();
    if (t.code != static_cast<uint8_t>(code) || t.bits != bits || t.lanes != 1 || a.ndim() != 1 ||
        (a.shape(0) > 1 && a.stride(0) != 1))
        raise(PyExc_ValueError, std::string(name) + " must be a contiguous 1-d " + want + " array");
    *n = static_cast<int64_t>(a.shape(0));
    static const int64_t empty = 0;
    return a.data() ? a.data() : &empty;
}

// block_mask: the tuple (block_q, block_k, batch, heads, q_blocks, offsets int64,
// kv_blocks int32, partial int64 or None, bits uint8 or None) of an fa_block_mask
// (flashattn.torch.flex builds it from torch's BlockMask). The library checks every
// value; the arrays' lengths, which its plain pointers do not carry, are checked here.
void fill_block_mask(Call &c, nb::handle obj)
{
    if (obj.is_none())
        return;
    if (!PyTuple_Check(obj.ptr()) || PyTuple_GET_SIZE(obj.ptr()) != 9)
        raise(PyExc_TypeError, "block_mask must be a tuple (block_q, block_k, batch, heads, q_blocks, offsets, "
                               "kv_blocks, partial, bits)");
    fa_block_mask &m = c.block_mask;
    int64_t *dims[5] = {&m.block_q, &m.block_k, &m.batch, &m.heads, &m.q_blocks};
    for (int i = 0; i < 5; i++) {
        const long long x = PyLong_AsLongLong(PyTuple_GET_ITEM(obj.ptr(), i));
        if (x == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            raise(PyExc_TypeError, "block_mask: block_q, block_k, batch, heads and q_blocks must be ints");
        }
        *dims[i] = x;
    }
    using code = nb::dlpack::dtype_code;
    const nb::handle item[4] = {PyTuple_GET_ITEM(obj.ptr(), 5), PyTuple_GET_ITEM(obj.ptr(), 6),
                                PyTuple_GET_ITEM(obj.ptr(), 7), PyTuple_GET_ITEM(obj.ptr(), 8)};
    int64_t n_off = 0, n_kv = 0, n_part = 0, n_bits = 0;
    m.offsets = static_cast<const int64_t *>(flat_of(c.keep, item[0], "block_mask offsets", code::Int, 64, &n_off));
    m.kv_blocks = static_cast<const int32_t *>(flat_of(c.keep, item[1], "block_mask kv_blocks", code::Int, 32, &n_kv));
    m.partial = static_cast<const int64_t *>(flat_of(c.keep, item[2], "block_mask partial", code::Int, 64, &n_part));
    m.bits = static_cast<const uint8_t *>(flat_of(c.keep, item[3], "block_mask bits", code::UInt, 8, &n_bits));
    c.a.block_mask = &m;
    if (m.block_q < 1 || m.block_k < 1 || m.batch < 1 || m.heads < 1 || m.q_blocks < 0)
        return; // the library's checks and messages
    int64_t rows = 0;
    if (m.block_q > INT32_MAX || m.block_k > INT32_MAX || __builtin_mul_overflow(m.batch, m.heads, &rows) ||
        __builtin_mul_overflow(rows, m.q_blocks, &rows) || rows == INT64_MAX)
        raise(PyExc_ValueError, "block_mask: block_q and block_k must be below 2^31, and batch * heads * q_blocks "
                                "must fit in 64 bits");
    if (!m.offsets || n_off != rows + 1)
        raise(PyExc_ValueError, "block_mask offsets must have batch * heads * q_blocks + 1 = " +
                                    std::to_string(rows + 1) + " entries, got " + std::to_string(n_off));
    const int64_t entries = m.offsets[rows];
    if (entries < 0 || n_kv < entries || (m.partial && n_part < entries))
        raise(PyExc_ValueError, "block_mask kv_blocks and partial must have offsets[-1] = " + std::to_string(entries) +
                                    " entries, got " + std::to_string(n_kv) + " and " + std::to_string(n_part));
    const int64_t per_mask = m.block_q * ((m.block_k + 7) / 8);
    if (n_bits % per_mask != 0)
        raise(PyExc_ValueError, "block_mask bits must hold whole element masks of block_q * ceil(block_k / 8) = " +
                                    std::to_string(per_mask) + " bytes, got " + std::to_string(n_bits));
    m.n_partial = n_bits / per_mask;
}

// Fills *c from the keywords shared by forward and backward: the table's tensors and
// options, then the plain pointers, whose extents the library cannot see and which are
// checked here.
void fill(Call &c, const Args &args)
{
    fa_forward_args &a = c.a;
    fill_part(c, args, FWD);
    const nb::handle alibi = args[FWD_alibi_slopes];
    if (!alibi.is_none()) {
        in_array s;
        if (!nb::try_cast(alibi, s))
            raise(PyExc_TypeError, "alibi_slopes: expected a float32 array");
        check_cpu(s, "alibi_slopes");
        const auto t = s.dtype();
        if (t.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Float) || t.bits != 32)
            raise(PyExc_ValueError, "alibi_slopes must be float32");
        if (s.ndim() < 1 || s.ndim() > 2 || (s.shape(s.ndim() - 1) > 1 && s.stride(s.ndim() - 1) != 1))
            raise(PyExc_ValueError, "alibi_slopes must be (nheads,) or (batch, nheads) with contiguous rows");
        // the library reads slopes[b * stride_b + h] for every h < Hq (and b < B): plain
        // pointers carry no length, so the extents are checked here
        const int64_t hq = a.q.shape[2], bq = a.q.shape[0];
        if (static_cast<int64_t>(s.shape(s.ndim() - 1)) < hq ||
            (s.ndim() == 2 && s.shape(0) != 1 && static_cast<int64_t>(s.shape(0)) < bq))
            raise(PyExc_ValueError, "alibi_slopes must be (nheads,) or (batch, nheads) for nheads = " +
                                        std::to_string(hq) + ", batch = " + std::to_string(bq));
        c.keep.hold(s);
        a.alibi_slopes = static_cast<const float *>(s.data());
        a.alibi_stride_b = s.ndim() == 2 ? s.stride(0) : 0;
        if (s.ndim() == 2 && s.shape(0) == 1)
            a.alibi_stride_b = 0;
    }
    int64_t n_q = 0, n_k = 0, rows = 0;
    a.cu_seqlens_q = int32_of(c.keep, args[FWD_cu_seqlens_q], "cu_seqlens_q", &rows, &n_q);
    a.cu_seqlens_k = int32_of(c.keep, args[FWD_cu_seqlens_k], "cu_seqlens_k", &rows, &n_k);
    if (a.cu_seqlens_q) {
        if (a.cu_seqlens_k && n_k != n_q)
            raise(PyExc_ValueError, "cu_seqlens_q and cu_seqlens_k must have the same length");
        if (n_q < 1)
            raise(PyExc_ValueError, "cu_seqlens_q needs batch + 1 >= 1 entries");
        a.num_seqs = n_q - 1;
    }
    if (!args[KV_k].is_none() || !args[KV_v].is_none()) {
        fa_kv_cache &kc = c.cache;
        fill_part(c, args, KV);
        // seqlens, batch_idx and the block table are plain pointers to the library:
        // each must cover every sequence of the call
        const int64_t batch = a.cu_seqlens_q ? a.num_seqs : a.q.shape[0];
        auto covers = [batch](const char *name, int64_t have) {
            if (have < batch)
                raise(PyExc_ValueError, std::string(name) + " has " + std::to_string(have) +
                                            " entries for a batch of " + std::to_string(batch));
        };
        int64_t r = 0, n = 0;
        kc.seqlens = int32_of(c.keep, args[KV_seqlens], "cache_seqlens", &r, &n);
        if (kc.seqlens)
            covers("cache_seqlens", r * n);
        kc.batch_idx = int32_of(c.keep, args[KV_batch_idx], "cache_batch_idx", &r, &n);
        if (kc.batch_idx)
            covers("cache_batch_idx", r * n);
        int64_t bt_rows = 0, bt_cols = 0;
        kc.block_table = int32_of(c.keep, args[KV_block_table], "block_table", &bt_rows, &bt_cols);
        if (kc.block_table)
            covers("block_table (rows)", bt_rows);
        kc.max_pages = kc.block_table ? bt_cols : 0;
        kc.leftpad = int32_of(c.keep, args[KV_leftpad], "cache_leftpad", &r, &n);
        if (kc.leftpad)
            covers("cache_leftpad", r * n);
        a.kv_cache = &kc;
    }
    a.sinks = floats_of(c.keep, args[FWD_sinks], "sinks", a.q.shape[2]);
    fill_block_mask(c, args[FWD_block_mask]);
}

void forward(Context &ctx, const nb::args &pos, const nb::kwargs &kw)
{
    fa_context *c = ctx.get();
    Call call;
    fill(call, parse(pos, kw, "forward"));
    fa_status st;
    {
        nb::gil_scoped_release unlocked;
        st = fa_forward(c, &call.a);
    }
    check(st, c, "fa_forward");
}

// fa_forward_work: the kept pairs and FLOPs of the call forward() would make, by the
// library's one rule (docs/semantics.md, section 9); nothing runs and nothing is
// written. An invalid call raises what forward() would.
nb::dict forward_work(Context &ctx, const nb::args &pos, const nb::kwargs &kw)
{
    fa_context *c = ctx.get();
    Call call;
    fill(call, parse(pos, kw, "forward_work"));
    fa_work w = FA_WORK_INIT;
    check(fa_forward_work(c, &call.a, &w), c, "fa_forward_work");
    nb::dict d;
    d["pairs"] = w.pairs;
    d["flops"] = w.flops;
    d["backward_flops"] = w.backward_flops;
    return d;
}

// The forward's keywords, and the backward's: dout, dq, dk, dv, dsinks.
void backward(Context &ctx, const nb::args &pos, const nb::kwargs &kw)
{
    fa_context *c = ctx.get();
    Call call;
    const Args args = parse(pos, kw, "backward", true);
    fill(call, args);
    fa_backward_args &b = call.b;
    b.fwd = &call.a;
    fill_part(call, args, BWD);
    b.dsinks = floats_of(call.keep, args[BWD_dsinks], "dsinks", call.a.q.shape[2]);
    fa_status st;
    {
        nb::gil_scoped_release unlocked;
        st = fa_backward(c, &b);
    }
    check(st, c, "fa_backward");
}

void merge_states(Context &ctx, const std::vector<nb::handle> &o_parts, const std::vector<nb::handle> &lse_parts,
                  nb::handle o, nb::handle lse)
{
    fa_context *c = ctx.get();
    if (o_parts.size() != lse_parts.size())
        raise(PyExc_ValueError, "merge_states: as many lse parts as output parts are needed");
    Keep keep;
    std::vector<fa_tensor> os, ls;
    for (size_t i = 0; i < o_parts.size(); i++) {
        os.push_back(tensor_of<in_array>(keep, o_parts[i], "out part"));
        ls.push_back(tensor_of<in_array>(keep, lse_parts[i], "lse part", false, false, true));
    }
    fa_tensor ot = tensor_of<out_array>(keep, o, "out");
    fa_tensor lt = tensor_of<out_array>(keep, lse, "lse", false, false, true);
    fa_status st;
    {
        nb::gil_scoped_release unlocked;
        st = fa_merge_states(c, static_cast<int>(os.size()), os.data(), ls.data(), &ot, &lt);
    }
    check(st, c, "fa_merge_states");
}

// The torch fast path (flashattn.torch._ops.forward_lean / sdpa_lean): one call from
// Python for an inference forward on torch tensors, which here become DLPack
// capsules (torch.utils.dlpack.to_dlpack, ~0.2 us; Tensor.__dlpack__ costs ~2 us)
// and get their output from torch.empty_strided, both called through the C API.
// The binding never links libtorch: flashattn.torch._ops hands the two functions
// over once at import (torch_setup), so nothing here imports torch. What the path
// does not take (a non-CPU tensor, another rank) gives None, and the caller's
// general path raises its own message.
PyObject *g_to_dlpack = nullptr;
PyObject *g_empty_strided = nullptr;
PyObject *g_tensor_type = nullptr;  // torch.Tensor: what kvcache_torch's lenient form takes
PyObject *g_dtype_kwname = nullptr; // ("dtype",), the keyword names of the vectorcall
PyObject *g_dtype_attr = nullptr;   // "dtype", interned

void torch_setup(nb::handle to_dlpack, nb::handle empty_strided, nb::handle tensor_type)
{
    // Held for the life of the process, as the torch module itself is.
    g_to_dlpack = nb::borrow(to_dlpack).release().ptr();
    g_empty_strided = nb::borrow(empty_strided).release().ptr();
    g_tensor_type = nb::borrow(tensor_type).release().ptr();
    g_dtype_attr = PyUnicode_InternFromString("dtype");
    g_dtype_kwname = PyTuple_Pack(1, g_dtype_attr);
    if (!g_dtype_attr || !g_dtype_kwname)
        throw nb::python_error();
}

nb::object call_or_raise(PyObject *r)
{
    if (!r)
        throw nb::python_error();
    return nb::steal(r);
}

nb::object dlpack_of(nb::handle tensor)
{
    return call_or_raise(PyObject_CallOneArg(g_to_dlpack, tensor.ptr()));
}

// torch.empty_strided(shape, strides, dtype=dtype) for an n-d row-major or
// head-major (bnsd) output.
nb::object empty_strided(const int64_t *shape, const int64_t *strides, size_t nd, nb::handle dtype)
{
    nb::object sh = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(nd)));
    nb::object st = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(nd)));
    if (!sh.is_valid() || !st.is_valid())
        throw nb::python_error();
    for (size_t i = 0; i < nd; i++) {
        PyObject *a = PyLong_FromLongLong(shape[i]), *b = PyLong_FromLongLong(strides[i]);
        if (!a || !b) {
            Py_XDECREF(a);
            Py_XDECREF(b);
            throw nb::python_error();
        }
        PyTuple_SET_ITEM(sh.ptr(), static_cast<Py_ssize_t>(i), a);
        PyTuple_SET_ITEM(st.ptr(), static_cast<Py_ssize_t>(i), b);
    }
    PyObject *args[3] = {sh.ptr(), st.ptr(), dtype.ptr()};
    return call_or_raise(PyObject_Vectorcall(g_empty_strided, args, 2, g_dtype_kwname));
}

nb::object forward_torch(Context &ctx, nb::handle q, nb::handle k, nb::handle v, nb::handle bias, nb::handle mask,
                         nb::handle opts, bool bnsd)
{
    fa_context *c = ctx.get();
    if (!g_to_dlpack)
        raise(PyExc_RuntimeError, "flashattn._C.forward_torch: torch_setup() has not run");
    // A tensor torch cannot export (meta, sparse, ...) is not this path's either:
    // the caller's general path says why.
    nb::object cq, ck, cv;
    for (auto [t, cap] : {std::pair<nb::handle, nb::object *>{q, &cq}, {k, &ck}, {v, &cv}}) {
        PyObject *r = PyObject_CallOneArg(g_to_dlpack, t.ptr());
        if (!r) {
            PyErr_Clear();
            return nb::none();
        }
        *cap = nb::steal(r);
    }
    in_array aq, ak, av;
    if (!nb::try_cast(cq, aq) || !nb::try_cast(ck, ak) || !nb::try_cast(cv, av))
        return nb::none();
    const size_t nd = aq.ndim();
    const auto cpu = nb::device::cpu::value;
    if (aq.device_type() != cpu || ak.device_type() != cpu || av.device_type() != cpu || ak.ndim() != nd ||
        av.ndim() != nd || !(nd == 4 || (bnsd && nd == 3)))
        return nb::none();
    Call call;
    fa_forward_args &a = call.a;
    a.q = tensor_from(aq, "q", false, false, false, bnsd);
    a.k = tensor_from(ak, "k", false, false, false, bnsd);
    a.v = tensor_from(av, "v", false, false, false, bnsd);
    nb::object cb, cm;
    if (!bias.is_none())
        cb = dlpack_of(bias);
    if (!mask.is_none())
        cm = dlpack_of(mask);
    a.bias = tensor_of<in_array>(call.keep, cb.is_valid() ? nb::handle(cb) : nb::handle(Py_None), "bias");
    a.mask = tensor_of<in_array>(call.keep, cm.is_valid() ? nb::handle(cm) : nb::handle(Py_None), "mask", true);
    Args options;
    take_options(options, opts, "forward_torch");
    fill_part(call, options, FWD);
    // out: (B, Sq, Hq, Dv) row-major; for bnsd the (B, Hq, Sq, Dv) view of that
    // buffer (SDPA's layout), or (B, Sq, Dv) for 3-d inputs
    const int64_t B = a.q.shape[0], S = a.q.shape[1], H = a.q.shape[2], Dv = a.v.shape[3];
    nb::object dtype = call_or_raise(PyObject_GetAttr(q.ptr(), g_dtype_attr));
    nb::object out;
    if (!bnsd) {
        const int64_t shape[4] = {B, S, H, Dv}, strides[4] = {S * H * Dv, H * Dv, Dv, 1};
        out = empty_strided(shape, strides, 4, dtype);
    } else if (nd == 4) {
        const int64_t shape[4] = {B, H, S, Dv}, strides[4] = {S * H * Dv, Dv, H * Dv, 1};
        out = empty_strided(shape, strides, 4, dtype);
    } else {
        const int64_t shape[3] = {B, S, Dv}, strides[3] = {S * Dv, Dv, 1};
        out = empty_strided(shape, strides, 3, dtype);
    }
    nb::object co = dlpack_of(out);
    out_array ao;
    if (!nb::try_cast(co, ao))
        raise(PyExc_RuntimeError, "flashattn._C.forward_torch: the output tensor gave no DLPack view");
    a.o = tensor_from(ao, "out", false, false, false, bnsd);
    fa_status st;
    {
        nb::gil_scoped_release unlocked;
        st = fa_forward(c, &a);
    }
    check(st, c, "fa_forward");
    return out;
}

// The torch fast path of flash_attn_with_kvcache (decoding: a call of a millisecond
// whose Python layer must stay a few percent of it): every tensor to a DLPack
// capsule here, the output from torch.empty_strided, then fa_forward. Returns out
// (B, Sq, Hq, Dv).
//
// lenient: the call as flash_attn_with_kvcache received it, before any conversion.
// What this path does not take as it is (an argument that is not a torch.Tensor,
// such as an int cache_seqlens; a tensor off the CPU; index arrays not int32 and
// contiguous; a q not 4-d; torch not set up yet) gives None before anything is
// written, and the caller's general path converts or raises its own message.
// Decoding pays for every Python step several times over: the kernel's pass over
// the cache evicts the interpreter's code and data from this core's caches, so the
// next call's Python runs cold (measured at L = 4096: a torch attribute read, ~0.5 us
// warm, then costs ~6 us; torch.empty ~3 us, then ~25 us). Hence one call from
// Python, with every check here. Without lenient, index arrays are already int32
// (flashattn.interface converts them).
nb::object kvcache_torch(Context &ctx, nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle k, nb::handle v,
                         nb::handle seqlens, nb::handle batch_idx, nb::handle block_table, nb::handle leftpad,
                         nb::handle k_scale, nb::handle v_scale, nb::handle opts, bool lenient)
{
    fa_context *c = ctx.get();
    if (!g_to_dlpack) {
        if (lenient)
            return nb::none();
        raise(PyExc_RuntimeError, "flashattn._C.kvcache_torch: torch_setup() has not run");
    }
    static const int keys[11] = {FWD_q,  FWD_k,      FWD_v,        KV_k,         KV_v,      KV_k_scale,
                                 KV_v_scale, KV_seqlens, KV_batch_idx, KV_block_table, KV_leftpad};
    const nb::handle tensors[11] = {q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens, batch_idx, block_table, leftpad};
    if (lenient) {
        if (q.is_none() || seqlens.is_none() || k_cache.is_none() || v_cache.is_none()) // the general path's words
            return nb::none();
        for (const nb::handle &t : tensors)
            if (!t.is_none() && !PyObject_TypeCheck(t.ptr(), reinterpret_cast<PyTypeObject *>(g_tensor_type)))
                return nb::none();
    }
    nb::object caps[11];
    Call call;
    try {
        Args args;
        take_options(args, opts, "kvcache_torch");
        for (int i = 0; i < 11; i++)
            if (!tensors[i].is_none()) {
                caps[i] = dlpack_of(tensors[i]);
                args.h[keys[i]] = caps[i].ptr();
            }
        fill(call, args);
    } catch (nb::python_error &) {
        // fill refuses a q that is not 4-d, a tensor off the CPU, an index array not
        // int32 or not contiguous: the general path converts or raises in its words
        if (!lenient)
            throw;
        return nb::none(); // the error goes with the exception; nothing was written
    }
    fa_forward_args &a = call.a;
    const int64_t B = a.q.shape[0], S = a.q.shape[1], H = a.q.shape[2], Dv = call.cache.v.shape[3];
    const int64_t shape[4] = {B, S, H, Dv}, strides[4] = {S * H * Dv, H * Dv, Dv, 1};
    nb::object out = empty_strided(shape, strides, 4, call_or_raise(PyObject_GetAttr(q.ptr(), g_dtype_attr)));
    a.o = tensor_of<out_array>(call.keep, dlpack_of(out), "out");
    fa_status st;
    {
        nb::gil_scoped_release unlocked;
        st = fa_forward(c, &a);
    }
    check(st, c, "fa_forward");
    return out;
}

// `runs` forwards of one built call with the GIL released: seconds per call.
double time_loop(fa_context *c, const fa_forward_args &a, int64_t runs)
{
    fa_status st = FA_OK;
    double seconds;
    {
        nb::gil_scoped_release unlocked;
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t r = 0; r < runs && st == FA_OK; r++)
            st = fa_forward(c, &a);
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    check(st, c, "fa_forward");
    return seconds / static_cast<double>(runs > 0 ? runs : 1);
}

// For the benchmark: the C call alone, `runs` times on arguments built once, so
// that the binding's own per-call cost is (Python per-call time - this).
double time_forward_c(Context &ctx, nb::handle q, nb::handle k, nb::handle v, nb::handle o, int64_t runs)
{
    fa_context *c = ctx.get();
    Call call;
    call.a.q = tensor_of<in_array>(call.keep, q, "q");
    call.a.k = tensor_of<in_array>(call.keep, k, "k");
    call.a.v = tensor_of<in_array>(call.keep, v, "v");
    call.a.o = tensor_of<out_array>(call.keep, o, "out");
    return time_loop(c, call.a, runs);
}

// For the benchmark: any forward call (the arguments of forward(), a KV cache's
// included) built once and run `runs` times in C, so that a front end's per-call
// cost is (its per-call time - this). An append writes the same rows every run.
double time_call_c(Context &ctx, int64_t runs, const nb::args &pos, const nb::kwargs &kw)
{
    fa_context *c = ctx.get();
    Call call;
    fill(call, parse(pos, kw, "time_call_c"));
    return time_loop(c, call.a, runs);
}

// fa_tune: the sweep with the GIL released; a Python progress callback runs with the
// GIL taken back, and the first exception it raises stops further calls and is
// raised once the sweep is over.
struct Progress {
    nb::handle fn;
    std::unique_ptr<nb::python_error> error;
};

void tune_progress(void *user, int done, int total, int64_t tile_q, int64_t tile_kv, double ms)
{
    auto *p = static_cast<Progress *>(user);
    nb::gil_scoped_acquire gil;
    if (p->error)
        return;
    try {
        p->fn(done, total, tile_q, tile_kv, ms);
    } catch (nb::python_error &e) {
        p->error = std::make_unique<nb::python_error>(e);
    }
}

nb::object timing_dict(const fa_tune_timing &t)
{
    nb::dict d;
    d["tile_q"] = t.tile_q;
    d["tile_kv"] = t.tile_kv;
    d["asked_q"] = t.asked_q;
    d["asked_kv"] = t.asked_kv;
    d["ms"] = std::isnan(t.ms) ? nb::object(nb::none()) : nb::object(nb::float_(t.ms));
    return d;
}

nb::dict result_dict(const fa_tune_result &r)
{
    nb::dict d;
    d["best"] = timing_dict(r.best);
    d["heuristic"] = timing_dict(r.heuristic);
    d["saved_tiles"] = nb::make_tuple(r.saved_tile_q, r.saved_tile_kv);
    d["saved"] = r.saved != 0;
    d["path"] = r.path[0] ? nb::object(nb::str(r.path)) : nb::none();
    d["key"] = std::string(r.key);
    d["cpu"] = std::string(r.cpu);
    d["note"] = std::string(r.note);
    d["threads"] = r.threads;
    d["runs"] = r.runs;
    nb::list timings;
    for (int i = 0; i < r.n_timings; i++)
        timings.append(timing_dict(r.timings[i]));
    d["timings"] = timings;
    return d;
}

nb::dict tune(Context &ctx, const std::vector<int64_t> &tile_qs, const std::vector<int64_t> &tile_kvs, int64_t runs,
              bool save, nb::handle path, nb::handle progress, const nb::args &pos, const nb::kwargs &kw)
{
    fa_context *c = ctx.get();
    Call call;
    fill(call, parse(pos, kw, "tune"));
    fa_tune_options opt;
    fa_tune_options_init(&opt);
    if (!tile_qs.empty()) {
        opt.tile_qs = tile_qs.data();
        opt.n_tile_qs = static_cast<int>(tile_qs.size() < 1000 ? tile_qs.size() : 1000);
    }
    if (!tile_kvs.empty()) {
        opt.tile_kvs = tile_kvs.data();
        opt.n_tile_kvs = static_cast<int>(tile_kvs.size() < 1000 ? tile_kvs.size() : 1000);
    }
    opt.runs = runs;
    opt.save = save ? 1 : 0;
    std::string file;
    if (!path.is_none()) {
        file = nb::cast<std::string>(nb::str(path));
        opt.path = file.c_str();
    }
    Progress p{progress, nullptr};
    if (!progress.is_none()) {
        opt.progress = tune_progress;
        opt.user = &p;
    }
    auto r = std::make_unique<fa_tune_result>();
    std::memset(r.get(), 0, sizeof *r);
    r->struct_size = sizeof *r;
    fa_status st;
    {
        nb::gil_scoped_release unlocked;
        st = fa_tune(c, &call.a, &opt, r.get());
    }
    if (p.error)
        throw *p.error;
    check(st, c, "fa_tune");
    return result_dict(*r);
}

// fa_args_field for every field of a struct: the library's own description, from which
// flashattn builds its Options and the torch ops' schemas.
nb::list fields(int kind)
{
    nb::list out;
    for (int i = 0;; i++) {
        fa_field f = FA_FIELD_INIT;
        const fa_status st = fa_args_field(static_cast<fa_args_kind>(kind), i, &f);
        if (st == FA_ERR_OUT_OF_RANGE)
            break;
        check(st, nullptr, "fa_args_field");
        nb::dict d;
        d["name"] = f.name;
        d["key"] = f.key;
        d["ctype"] = f.ctype;
        d["doc"] = f.doc;
        d["offset"] = f.offset;
        d["size"] = f.size;
        d["type"] = static_cast<int>(f.type);
        d["role"] = static_cast<int>(f.role);
        d["default"] = f.default_value;
        out.append(d);
    }
    return out;
}

// fa_probe on the context's threads and ISA path: the peaks the benchmark divides by.
double probe(Context &ctx, int kind)
{
    double value = 0.0;
    fa_status st;
    {
        nb::gil_scoped_release unlocked;
        st = fa_probe(ctx.get(), static_cast<fa_probe_kind>(kind), &value);
    }
    check(st, ctx.get(), "fa_probe");
    return value;
}

int64_t context_get(const Context &ctx, int param)
{
    int64_t value = 0;
    check(fa_context_get(ctx.get(), static_cast<fa_param>(param), &value), ctx.get(), "fa_context_get");
    return value;
}

// ---------------------------------------------------------------- ring planner
// The core's ring planner (fa_ring_placement, fa_ring_step, fa_ring_block) for
// flashattn.torch.distributed, which then only moves tensors. The calls' options come
// as the few values the planner reads; a piece is the tuple (q_row, rows, k_row, keys,
// q_pos, k_pos, q_start, k_start, causal, kept, diagonal).

nb::tuple ring_piece_tuple(const fa_ring_piece &p)
{
    return nb::make_tuple(p.q_row, p.rows, p.k_row, p.keys, p.q_pos, p.k_pos, p.q_start, p.k_start,
                          static_cast<int>(p.causal), p.kept, p.diagonal);
}

// {"segments": per rank [(pos, len, off)], "steps": this rank's pieces per step,
//  "blocks": the given (q_pos, rows, k_pos, keys) placed and counted}; without a
// context (None) the segments alone, which ask no core call.
nb::dict ring_plan(Context *ctx, const std::vector<int64_t> &lengths, int rank, bool zigzag, int causal,
                   int64_t window_left, int64_t window_right, bool alibi, float dropout_p, int pieces,
                   bool whole_shards, const std::vector<std::vector<int64_t>> &blocks)
{
    fa_context *c = ctx ? ctx->get() : nullptr;
    static const float slope_flag[1] = {0.0f}; // ALiBi on: the planner reads only whether it is set
    fa_forward_args call = FA_FORWARD_ARGS_INIT;
    call.causal = static_cast<fa_causal>(causal);
    call.window_left = window_left;
    call.window_right = window_right;
    call.alibi_slopes = alibi ? slope_flag : nullptr;
    call.dropout_p = dropout_p;
    fa_ring_plan plan = FA_RING_PLAN_INIT;
    plan.nranks = static_cast<int>(lengths.size());
    plan.rank = rank;
    plan.lengths = lengths.data();
    plan.sharding = zigzag ? FA_RING_ZIGZAG : FA_RING_CONTIGUOUS;
    plan.call = &call;
    plan.pieces = pieces;
    plan.whole_shards = whole_shards ? 1 : 0;
    nb::list segments, steps, placed;
    for (int r = 0; r < plan.nranks; r++) {
        fa_ring_segment seg[2];
        int n = 0;
        check(fa_ring_placement(c, &plan, r, seg, &n), c, "fa_ring_placement");
        nb::list l;
        for (int k = 0; k < n; k++) l.append(nb::make_tuple(seg[k].pos, seg[k].len, seg[k].off));
        segments.append(l);
    }
    std::vector<fa_ring_piece> pcs(4 * static_cast<size_t>(pieces > 0 ? pieces : 1));
    for (int s = 0; c && s < plan.nranks; s++) {
        int n = 0;
        check(fa_ring_step(c, &plan, s, pcs.data(), static_cast<int>(pcs.size()), &n), c, "fa_ring_step");
        nb::list l;
        for (int k = 0; k < n; k++) l.append(ring_piece_tuple(pcs[k]));
        steps.append(l);
    }
    if (!c && !blocks.empty())
        raise(PyExc_ValueError, "ring_plan: placing blocks needs a context");
    for (const auto &b : blocks) {
        if (b.size() != 4)
            raise(PyExc_ValueError, "ring_plan: a block is (q_pos, rows, k_pos, keys)");
        fa_ring_piece p;
        check(fa_ring_block(c, &plan, b[0], b[1], b[2], b[3], &p), c, "fa_ring_block");
        placed.append(ring_piece_tuple(p));
    }
    nb::dict d;
    d["segments"] = segments;
    d["steps"] = steps;
    d["blocks"] = placed;
    return d;
}

void add_ring_plan(nb::module_ &m)
{
    m.def("ring_plan", &ring_plan, nb::arg("ctx").none(), nb::arg("lengths"), nb::arg("rank"), nb::arg("zigzag"),
          nb::arg("causal"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("alibi"), nb::arg("dropout_p"),
          nb::arg("pieces") = 1, nb::arg("whole_shards") = false,
          nb::arg("blocks") = std::vector<std::vector<int64_t>>());
}

} // namespace

// ---------------------------------------------------------------- the host's threads
// flashattn.torch hands torch's intra-op pool to the library (fa_context_set_parallel),
// so that a PyTorch process never has two pools taking turns on its cores: torch's
// OpenMP workers spin after each of its ops while ours would start on the same cores.
// No torch or OpenMP header is needed: torch's wheel ships its OpenMP runtime
// (libgomp) and has loaded it by the time flashattn.torch runs, so the block finds it
// among the loaded objects and calls its GOMP_parallel entry, the one `#pragma omp
// parallel` compiles to (LLVM's libomp and Intel's libiomp5 export it too).
#include <dlfcn.h>
#include <link.h>

namespace {

struct omp_runtime {
    void (*parallel)(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) = nullptr;
    int (*thread_num)() = nullptr;
    int (*num_threads)() = nullptr;
    int (*max_threads)() = nullptr;
    std::string path; // the runtime's file; "" when none was found
    std::string why;  // why none, when none
};

// The loaded OpenMP runtime to use: torch's own where several are loaded.
int omp_candidate(struct dl_phdr_info *info, size_t, void *out)
{
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *base = std::strrchr(name, '/') ? std::strrchr(name, '/') + 1 : name;
    if (std::strncmp(base, "libgomp", 7) != 0 && std::strncmp(base, "libiomp5", 8) != 0 &&
        std::strncmp(base, "libomp", 6) != 0)
        return 0;
    auto *path = static_cast<std::string *>(out);
    if (path->empty() || std::strstr(name, "/torch/"))
        *path = name;
    return std::strstr(name, "/torch/") != nullptr; // stop at torch's
}

omp_runtime omp_load()
{
    omp_runtime rt;
    std::string path;
    dl_iterate_phdr(omp_candidate, &path);
    if (path.empty()) {
        rt.why = "no OpenMP runtime (libgomp, libomp, libiomp5) is loaded in this process";
        return rt;
    }
    void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD); // kept: the runtime stays loaded
    if (!h) {
        rt.why = "could not open the loaded " + path;
        return rt;
    }
    rt.parallel = reinterpret_cast<decltype(rt.parallel)>(dlsym(h, "GOMP_parallel"));
    rt.thread_num = reinterpret_cast<int (*)()>(dlsym(h, "omp_get_thread_num"));
    rt.num_threads = reinterpret_cast<int (*)()>(dlsym(h, "omp_get_num_threads"));
    rt.max_threads = reinterpret_cast<int (*)()>(dlsym(h, "omp_get_max_threads"));
    if (!rt.parallel || !rt.thread_num || !rt.num_threads || !rt.max_threads) {
        rt = omp_runtime{};
        rt.why = path + " lacks GOMP_parallel or omp_get_{thread_num,num_threads,max_threads}";
        return rt;
    }
    rt.path = path;
    return rt;
}

// Looked up once (C++ statics are initialised once, thread-safely), at the first use.
const omp_runtime &omp()
{
    static const omp_runtime rt = omp_load();
    return rt;
}

struct omp_job {
    const omp_runtime *rt;
    fa_parallel_task task;
    void *arg;
    int nth;
};

// One thread of the region: its shares round robin (a region narrower than nth, as
// a nested one is, still runs every share once).
void omp_region(void *p)
{
    const auto *j = static_cast<const omp_job *>(p);
    const int t = j->rt->thread_num(), n = j->rt->num_threads();
    for (int i = t; i < j->nth; i += n)
        j->task(j->arg, i, j->nth);
}

// The parallel-for: a region as wide as the shares, at most torch's thread count on
// this thread (torch.set_num_threads sets the same runtime's omp_set_num_threads).
int omp_parallel_for(void *user, int nth, fa_parallel_task task, void *arg)
{
    const auto *rt = static_cast<const omp_runtime *>(user);
    omp_job job{rt, task, arg, nth};
    const int most = rt->max_threads();
    rt->parallel(omp_region, &job, static_cast<unsigned>(nth < most ? nth : most), 0);
    return 0;
}

// Puts ctx's parallel work on the loaded OpenMP runtime (on = true) or back on its own
// threads. Returns "" on success, else why not (the context keeps its own threads).
std::string set_host_pool(Context &ctx, bool on)
{
    const omp_runtime &rt = omp();
    if (on && rt.path.empty())
        return rt.why;
    check(fa_context_set_parallel(ctx.get(), on ? omp_parallel_for : nullptr,
                                  on ? const_cast<omp_runtime *>(&rt) : nullptr),
          ctx.get(), "fa_context_set_parallel");
    return "";
}

void bind_host_pool(nb::module_ &m)
{
    m.def("set_host_pool", &set_host_pool, nb::arg("ctx"), nb::arg("on"));
    // (the runtime's file, why none): one of the two is ""
    m.def("omp_runtime", []() {
        nb::dict d;
        d["path"] = omp().path;
        d["why"] = omp().why;
        return d;
    });
    m.attr("PARAM_LAST_POOL") = static_cast<int>(FA_PARAM_LAST_POOL);
}

} // namespace

NB_MODULE(_C, m)
{
    m.doc() = "flashattn._C: the compiled binding of libflashattn (see flashattn for the Python API)";

    nb::class_<Context>(m, "Context")
        .def(nb::init<int64_t, int64_t>(), nb::arg("threads") = 0, nb::arg("algo") = 0)
        .def("set",
             [](Context &c, int param, int64_t value) {
                 check(fa_context_set(c.get(), static_cast<fa_param>(param), value), c.get(), "fa_context_set");
             })
        .def("get", &context_get)
        .def_prop_ro("isa", [](const Context &c) { return std::string(fa_context_isa(c.get())); })
        .def_prop_ro("closed", [](const Context &c) { return c.ctx == nullptr; })
        .def("close", [](Context &c) {
            fa_context_free(c.ctx);
            c.ctx = nullptr;
        });

    for (int i = 0; i < N_KEYS; i++)
        if (is_keyword(g_rows[i]) || i == FWD_block_mask)
            g_key_names[i] = PyUnicode_InternFromString(g_rows[i].key);
    g_opts_name = PyUnicode_InternFromString("opts");
    m.def("forward", &forward);
    m.def("forward_work", &forward_work);
    m.def("fields", &fields, nb::arg("kind"));
    m.def("torch_setup", &torch_setup, nb::arg("to_dlpack"), nb::arg("empty_strided"), nb::arg("tensor_type"));
    m.def("forward_torch", &forward_torch, nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
          nb::arg("bias").none(), nb::arg("mask").none(), nb::arg("opts").none(), nb::arg("bnsd"));
    m.def("backward", &backward);
    m.def("merge_states", &merge_states, nb::arg("ctx"), nb::arg("out_parts"), nb::arg("lse_parts"),
          nb::arg("out"), nb::arg("lse").none());
    m.def("kvcache_torch", &kvcache_torch, nb::arg("ctx"), nb::arg("q").none(), nb::arg("k_cache").none(),
          nb::arg("v_cache").none(), nb::arg("k").none(), nb::arg("v").none(), nb::arg("cache_seqlens").none(),
          nb::arg("cache_batch_idx").none(), nb::arg("block_table").none(), nb::arg("cache_leftpad").none(),
          nb::arg("k_scale").none(), nb::arg("v_scale").none(), nb::arg("opts").none(), nb::arg("lenient") = false);
    m.def("time_call_c", &time_call_c);
    m.def("time_forward_c", &time_forward_c, nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
          nb::arg("out"), nb::arg("runs"));
    m.def("probe", &probe, nb::arg("ctx"), nb::arg("kind"));
    m.def("tune", &tune, nb::arg("ctx"), nb::arg("tile_qs"), nb::arg("tile_kvs"), nb::arg("runs"), nb::arg("save"),
          nb::arg("path").none(), nb::arg("progress").none(), nb::arg("args"), nb::arg("kwargs"));
    /* the C enums' values, each under its name without FA_ */
    const auto ints = [&m](std::initializer_list<std::pair<const char *, int>> values) {
        for (const auto &v : values) m.attr(v.first) = v.second;
    };
    ints({{"ARGS_FORWARD", FA_ARGS_FORWARD}, {"ARGS_BACKWARD", FA_ARGS_BACKWARD}, {"ARGS_KV_CACHE", FA_ARGS_KV_CACHE},
          {"FIELD_SIZE", FA_FIELD_SIZE}, {"FIELD_TENSOR", FA_FIELD_TENSOR}, {"FIELD_F32", FA_FIELD_F32},
          {"FIELD_I32", FA_FIELD_I32}, {"FIELD_I64", FA_FIELD_I64}, {"FIELD_U32", FA_FIELD_U32},
          {"FIELD_U64", FA_FIELD_U64}, {"FIELD_PTR", FA_FIELD_PTR}, {"ROLE_HEADER", FA_ROLE_HEADER},
          {"ROLE_INPUT", FA_ROLE_INPUT}, {"ROLE_OUTPUT", FA_ROLE_OUTPUT}, {"ROLE_INOUT", FA_ROLE_INOUT},
          {"ROLE_OPTION", FA_ROLE_OPTION}, {"ROLE_DERIVED", FA_ROLE_DERIVED}, {"ROLE_FORM", FA_ROLE_FORM}});
    ints({{"PROBE_FMA_PEAK", FA_PROBE_FMA_PEAK}, {"PROBE_BF16_PEAK", FA_PROBE_BF16_PEAK},
          {"PROBE_READ_BW", FA_PROBE_READ_BW}});
    m.def("version", []() { return std::string(fa_version_string()); });
    m.def("cpu_features", []() { return std::string(fa_cpu_features()); });
    m.def("cpu_model", []() { return std::string(fa_cpu_model()); });
    m.def("algo_name", [](int algo) { return std::string(fa_algo_name(static_cast<fa_algo>(algo))); });
    bind_host_pool(m);

    ints({{"PARAM_THREADS", FA_PARAM_THREADS}, {"PARAM_ALGO", FA_PARAM_ALGO}, {"PARAM_KV_SPLITS", FA_PARAM_KV_SPLITS},
          {"PARAM_KV_PACK", FA_PARAM_KV_PACK}, {"PARAM_QUANT_MATMUL", FA_PARAM_QUANT_MATMUL},
          {"PARAM_LAST_ALGO", FA_PARAM_LAST_ALGO},
          {"PARAM_LAST_THREADS", FA_PARAM_LAST_THREADS}, {"PARAM_LAST_EXTRA_BYTES", FA_PARAM_LAST_EXTRA_BYTES},
          {"PARAM_LAST_BACKWARD_PASSES", FA_PARAM_LAST_BACKWARD_PASSES},
          {"PARAM_LAST_KV_PACKED", FA_PARAM_LAST_KV_PACKED}, {"PARAM_LAST_KV_PACK_US", FA_PARAM_LAST_KV_PACK_US},
          {"PARAM_LAST_TILE_Q", FA_PARAM_LAST_TILE_Q}, {"PARAM_LAST_TILE_KV", FA_PARAM_LAST_TILE_KV}});
    add_ring_plan(m);
}
