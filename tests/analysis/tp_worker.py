"""One rank of the head-parallel tests (tests/analysis/test_tensor_parallel.py starts 2 of these).

Usage: python tp_worker.py RANK WORLD PORT OUT_DIR CASE[,CASE...]
Each case (a model variant of ``CONFIGS``) writes OUT_DIR/{case}.rank{R}.pkl: logits, a padded pass, a head-ablated
pass, greedy tokens with the KV cache, and (rank 0) the joined trace.
"""

import os
import pickle
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)  # the ranks share two cores

BASE = dict(n_layers=2, d_model=32, d_vocab=40, n_ctx=32)
#: One model per case: grouped-query with every bias (the biases must be added once), multi-query (the one K/V
#: head repeated on both ranks, 6 heads split 3 / 3 across its group), latent attention with a mixture of experts
#: (the latent and the experts replicated), and a parallel block with learned positions and a GELU MLP.
CONFIGS = {
    "gqa": dict(n_heads=4, n_kv_heads=2, positional="rotary", normalization="rms", activation="swiglu",
                attn_bias=True, out_bias=True, mlp_bias=True),
    "mqa": dict(n_heads=6, d_head=8, n_kv_heads=1, positional="learned", activation="gelu"),
    "mla": dict(n_heads=4, d_head=8, attention="latent", kv_latent_dim=12, q_latent_dim=10, rope_dim=4,
                v_head_dim=6, positional="rotary", normalization="rms", activation="swiglu", attn_bias=False,
                out_bias=False, mlp_bias=False, n_experts=4, n_experts_per_token=2, d_expert=12,
                dense_mlp_layers=(0,)),
    "parallel": dict(n_heads=4, n_kv_heads=2, positional="learned", parallel_block="two_norms",
                     activation="gelu", out_bias=True, mlp_bias=True),
}
NAMES = ["*hook_pattern", "*attn.hook_q", "*attn.hook_k", "*attn.hook_v", "*hook_z", "*hook_result",
         "*mlp.hook_post", "*hook_resid_post", "*hook_attn_out"]


def model(case: str):
    """The case's model, every parameter re-drawn (the default init leaves norms at 1 and biases at 0)."""
    from interp import ModelConfig
    from interp.placement import build

    net = build(ModelConfig(**BASE, **CONFIGS[case]), seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return net.eval()


def tokens():
    return torch.randint(0, 40, (3, 9), generator=torch.Generator().manual_seed(3))


def padding_mask():
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :4] = 0
    return mask


def gates(net):
    """Head 1 of layer 0 and the last head of layer 1 gated off: one on each rank."""
    g = torch.ones(net.cfg.n_layers, net.cfg.n_heads)
    g[0, 1] = 0.0
    g[1, -1] = 0.0
    return g


def gradients(run, net):
    """The gradient of a loss w.r.t. all-ones head gates and w.r.t. the (replicated) token embedding."""
    g = torch.ones(net.cfg.n_layers, max(b.attn.n_heads for b in net.blocks), requires_grad=True)
    if hasattr(run, "heads"):  # the head-parallel run: gates by global head index
        g = torch.ones(net.cfg.n_layers, run.n_heads[0], requires_grad=True)
    run.set_head_gates(g)
    net.zero_grad()
    logits = run(tokens())
    logits.log_softmax(-1)[:, :-1].gather(-1, tokens()[:, 1:, None]).sum().backward()
    run.set_head_gates(None)
    return g.grad.clone(), net.embed.weight.grad.clone()


def classify(net):
    """Eight pattern and weight kinds with bootstrap intervals, on short data."""
    from interp.analysis import classify_heads

    kinds = ["positional", "previous-token", "duplicate-token", "induction", "copy-suppression", "sink", "successor",
             "retrieval"]
    # Low thresholds, so that a random model's heads take kinds (and some sit near a threshold: uncertain).
    return classify_heads(net, n_seqs=4, half_len=6, kinds=kinds, bootstrap=50, copying_comparisons=None,
                          progress=False, positional_threshold=0.3, previous_token_threshold=0.2,
                          duplicate_token_threshold=0.2, induction_threshold=0.1, copying_threshold=0.1,
                          options=dict(sink_threshold=0.2, needle_len=4))


#: The per-layer patching runs compared with one process: inside a layer after attention, per position (the
#: prefix-cache path), and the attention write, whole layers.
PATCH_SITES = [("resid_mid", "layer_pos"), ("attn_out", "layer"), ("mlp_out", "layer_pos")]


def patch(net, act, by):
    """Noising activation patching of a repeated sequence with a corrupted second half, logit difference of
    two fixed answers at the last position."""
    from interp.analysis import activation_patching

    clean = tokens()
    corrupted = clean.clone()
    corrupted[:, 5:] = (clean[:, 5:] + 7) % 40
    answers = torch.tensor([[1, 2], [3, 4], [5, 6]])
    return activation_patching(net, clean, corrupted, act=act, by=by, answer_tokens=answers, batch_size=8,
                               progress=False)


def run(case: str, rank: int, world: int, out: Path) -> dict:
    from interp import distributed
    from interp.tensor_parallel import HeadParallel

    if case == "sliced":  # the gqa shard read straight from a checkpoint, against the model built and cut
        from interp.zoo.checkpoint import load_checkpoint_heads, save_checkpoint

        path = save_checkpoint(model("gqa"), out / f"sliced.rank{rank}.safetensors")  # the same model on each rank
        sliced, cut = HeadParallel(load_checkpoint_heads(path)), HeadParallel.from_model(model("gqa"))
        with torch.no_grad():
            return {name: (tp(tokens()), tp(tokens(), attention_mask=padding_mask()))
                    for name, tp in (("sliced", sliced), ("cut", cut))}

    if case == "die":  # rank 1 dies inside layer 1's attention; rank 0 must stop with an error, not hang
        tp = HeadParallel.from_model(model("gqa"))

        def die(z, hook):
            os._exit(7)

        t0 = time.monotonic()
        try:
            tp(tokens(), fwd_hooks=[("blocks.1.attn.hook_z", die)] if rank == 1 else [])
        except distributed.DistributedError as e:
            return {"error": str(e), "seconds": time.monotonic() - t0}
        return {"error": None, "seconds": time.monotonic() - t0}
    if case == "patching":  # per-layer activation patching on every rank, per position and whole layers
        tp = HeadParallel.from_model(model("gqa"))
        return {act + by: patch(tp, act, by) for act, by in PATCH_SITES}
    if case == "classify":
        tp = HeadParallel.from_model(model("gqa"))
        report = classify(tp)
        return {"df": report.df, "details": report.details, "layer_heads": report.layer_heads,
                "n_heads": report.n_heads}

    tp = HeadParallel.from_model(model(case))
    with torch.no_grad():
        logits = tp(tokens())
        padded = tp(tokens(), attention_mask=padding_mask())
        tp.set_head_gates(gates(tp.model))
        ablated = tp(tokens())
        tp.set_head_gates(None)
        generated = tp.generate(tokens()[:1], 6)
    _, trace = tp.run_with_cache(tokens(), names_filter=NAMES)
    gate_grad, embed_grad = gradients(tp, tp.model)
    heads = tp.heads
    return {"gate_grad": gate_grad, "embed_grad": embed_grad, "owned": heads,
            "logits": logits, "padded": padded, "ablated": ablated, "generated": generated,
            "heads": [b.attn.n_heads for b in tp.model.blocks],
            "trace": None if trace is None else {k: trace[k] for k in trace.keys()},
            "meta": None if trace is None else trace.meta}


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    from interp import distributed

    assert distributed.init_from_env(timeout_s=float(os.environ.get("INTERP_DIST_TIMEOUT", "60")))
    for case in sys.argv[5].split(","):
        result = run(case, rank, world, out)
        with open(out / f"{case}.rank{rank}.pkl", "wb") as f:
            pickle.dump(result, f)
    if "die" in sys.argv[5]:  # a peer is gone: leave as the CLI does after a DistributedError
        distributed.exit_after_failure(0)
    distributed.shutdown()


if __name__ == "__main__":
    main()
