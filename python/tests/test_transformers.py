"""test_transformers.py: a small Llama-style model end to end, flashattn against native SDPA.

The model is built from a LlamaConfig (2 layers, GQA, randomly initialised), so
nothing is downloaded (test-python.sh sets HF_HUB_OFFLINE=1). Three ways in are
tested, each against the same weights on transformers' own "sdpa":
  - attn_implementation="fa_cpu" (flashattn.transformers.register());
  - the unchanged "sdpa" model under `with flashattn.torch.sdpa():` (routing);
  - attn_implementation="flex_attention" under route_flex_attention() (flex:
    transformers' BlockMask on flashattn.flex_attention; torch's own flex has no
    CPU backward, so the optimizer steps run only routed).
Checks: logits (no mask, and a left-padded batch), three AdamW steps give the
same losses, greedy generate() with the KV cache gives the same tokens, and
stats() shows that flashattn really ran, with no fallback.
"""

import copy

import pytest

from conftest import needs_torch, torch

pytestmark = needs_torch
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import flashattn.torch as fat  # noqa: E402
import flashattn.transformers as fht  # noqa: E402

NAME = fht.register()


def _config():
    return transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                    attention_dropout=0.0)


def _pair(impl, dtype=torch.float32):
    """(native sdpa model, model under test) with identical weights."""
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM._from_config(copy.deepcopy(_config()), attn_implementation="sdpa",
                                                     torch_dtype=dtype)
    if impl == "routing":
        other = copy.deepcopy(ref)
    else:
        other = transformers.LlamaForCausalLM._from_config(copy.deepcopy(_config()),
                                                           attn_implementation="flex_attention" if impl == "flex"
                                                           else NAME, torch_dtype=dtype)
        other.load_state_dict(ref.state_dict())
    assert ref.config._attn_implementation == "sdpa"
    return ref, other


class _Runner:
    """Runs the model under test the way `impl` says (routing: inside flashattn.torch.sdpa();
    flex: with transformers' "flex_attention" routed to flashattn)."""

    def __init__(self, impl):
        self.impl = impl

    def __enter__(self):
        fat.reset_stats()
        if self.impl == "routing":
            fat.enable()
        if self.impl == "flex":
            fht.route_flex_attention(True)
        return self

    def __exit__(self, *exc):
        if self.impl == "routing":
            fat.disable()
        if self.impl == "flex":
            fht.route_flex_attention(False)
        return False


def _assert_ran_flashattn(min_calls):
    s = fat.stats()
    assert s["routed"] >= min_calls and not s["fallbacks"], s


def test_route_flex_attention_and_back():
    from transformers import AttentionInterface

    own = AttentionInterface._global_mapping["flex_attention"]
    fht.route_flex_attention(True)
    assert AttentionInterface._global_mapping["flex_attention"] is fht.flex_attention_forward
    fht.route_flex_attention(False)
    assert AttentionInterface._global_mapping["flex_attention"] is own


def test_registered_names():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    assert NAME == "fa_cpu" and NAME in AttentionInterface._global_mapping
    assert "flashattn" in AttentionInterface._global_mapping  # alias, for transformers without the "flash" rule
    assert NAME in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping


@pytest.mark.parametrize("impl", ["attn_implementation", "routing", "flex"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logits_match_native_sdpa(impl, dtype):
    dt = getattr(torch, dtype)
    ref, model = _pair(impl, dt)
    ref.eval()
    model.eval()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (2, 24), generator=gen)
    pad = torch.ones(2, 24, dtype=torch.long)
    pad[1, :5] = 0  # a left-padded row: a bool mask reaches the attention
    with torch.no_grad():
        want = ref(ids).logits.double()
        want_pad = ref(ids, attention_mask=pad).logits.double()
        with _Runner(impl):
            got = model(ids).logits.double()
            got_pad = model(ids, attention_mask=pad).logits.double()
            _assert_ran_flashattn(4)
    tol = 1e-5 if dt == torch.float32 else 3e-2  # bf16: rounding of every layer's activations
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= tol * scale
    assert (got_pad[0] - want_pad[0]).abs().max().item() <= tol * scale
    assert (got_pad[1, 5:] - want_pad[1, 5:]).abs().max().item() <= tol * scale


@pytest.mark.parametrize("impl", ["attn_implementation", "routing", "flex"])
def test_three_optimizer_steps_match(impl):
    ref, model = _pair(impl)
    gen = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, 96, (2, 32), generator=gen) for _ in range(3)]
    losses = []
    for m, routed in ((ref, False), (model, True)):
        m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        run = []
        with _Runner(impl if routed else "none"):
            for ids in batches:
                opt.zero_grad()
                loss = m(ids, labels=ids).loss
                loss.backward()
                opt.step()
                run.append(loss.item())
            if routed:
                _assert_ran_flashattn(6)
        losses.append(run)
    for a, b in zip(*losses):
        assert abs(a - b) <= 1e-5 * abs(a), losses
    assert losses[0][0] != losses[0][2]  # the steps did change the model


@pytest.mark.parametrize("impl", ["attn_implementation", "routing", "flex"])
def test_greedy_generate_with_kv_cache_same_tokens(impl):
    ref, model = _pair(impl)
    ref.eval()
    model.eval()
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 96, (2, 6), generator=gen)
    am = torch.ones_like(ids)
    kw = dict(max_new_tokens=12, do_sample=False, use_cache=True, attention_mask=am, pad_token_id=0)
    want = ref.generate(ids, **kw)
    with _Runner(impl):
        got = model.generate(ids, **kw)
        # one prefill + 11 cached decoding steps, in each of 2 layers
        _assert_ran_flashattn(2 * 12)
    assert torch.equal(got, want), (got, want)


def test_sliding_window_model_matches_native_sdpa():
    # Mistral-style sliding-window attention. With transformers 5 the window reaches
    # flashattn as the bool mask transformers builds (prefill) and as a cache that
    # keeps the last 8 keys (decoding); the window_size path for a skipped mask is
    # not reached by this model.
    cfg = transformers.MistralConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                     sliding_window=8)
    torch.manual_seed(0)
    ref = transformers.MistralForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa").eval()
    model = transformers.MistralForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=NAME).eval()
    model.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 96, (1, 30), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = ref(ids).logits
        fat.reset_stats()
        got = model(ids).logits
        _assert_ran_flashattn(2)
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    kw = dict(max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(ids[:, :20]), pad_token_id=0)
    assert torch.equal(model.generate(ids[:, :20], **kw), ref.generate(ids[:, :20], **kw))


def _gpt_oss_pair():
    """(eager gpt-oss, fa_cpu gpt-oss) with identical small random weights: 2 layers,
    one sliding (window 8) and one full, GQA, attention sinks drawn away from 0."""
    if not hasattr(transformers, "GptOssConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no gpt-oss")
    cfg = transformers.GptOssConfig(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                    num_experts_per_tok=2, sliding_window=8, max_position_embeddings=128,
                                    layer_types=["sliding_attention", "full_attention"], attention_dropout=0.0)
    torch.manual_seed(0)
    ref = transformers.GptOssForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="eager")
    with torch.no_grad():
        for layer in ref.model.layers:  # sinks that matter: some far above the scores
            layer.self_attn.sinks.copy_(torch.tensor([-1.0, 0.5, 2.0, 6.0]))
    model = transformers.GptOssForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=NAME)
    model.load_state_dict(ref.state_dict())
    return ref, model


def test_gpt_oss_sinks_match_eager():
    # gpt-oss passes its per-head sinks to the attention interface as s_aux; flashattn
    # takes them as `sinks` (no fallback), and logits and every gradient, the sinks'
    # included, match transformers' eager attention.
    ref, model = _gpt_oss_pair()
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(5))
    ref.train(), model.train()
    fat.reset_stats()
    losses = []
    for m in (ref, model):
        m.zero_grad()
        out = m(ids, labels=ids)
        out.loss.backward()
        losses.append((out.logits.detach().double(), out.loss.item()))
    _assert_ran_flashattn(2)
    (want, lw), (got, lg) = losses
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    assert abs(lg - lw) <= 1e-5 * abs(lw)
    grads = dict(model.named_parameters())
    for name, p in ref.named_parameters():
        if p.grad is None:
            continue
        g = grads[name].grad
        assert g is not None, name
        err = (g - p.grad).abs().max().item()
        assert err <= 1e-4 * max(p.grad.abs().max().item(), 1e-6), f"{name}: {err:.3g}"
    sink_grad = model.model.layers[0].self_attn.sinks.grad
    assert sink_grad is not None and sink_grad.abs().max().item() > 0
    # decoding with the KV cache: the same greedy tokens
    ref.eval(), model.eval()
    kw = dict(max_new_tokens=10, do_sample=False, attention_mask=torch.ones_like(ids[:, :12]), pad_token_id=0)
    assert torch.equal(model.generate(ids[:, :12], **kw), ref.generate(ids[:, :12], **kw))
