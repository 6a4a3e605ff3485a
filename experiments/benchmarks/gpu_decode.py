"""Greedy decoding on one GPU, interp against transformers' uncompiled static-cache generate (gpu_check's step 3
alone, for a short device call): SmolLM2-135M-shaped random weights, 64 new tokens, batch 1 and 32, interleaved.

    python experiments/benchmarks/gpu_decode.py
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import QUICK, SMOLLM2, hf_pair, interleaved  # noqa: E402


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    shape = {**SMOLLM2, **(QUICK["smollm2"] if "--quick" in sys.argv else {})}
    hf, ours = hf_pair(shape, device, torch.float32)
    hf.set_attn_implementation("sdpa")
    new = 64
    prompt = torch.randint(3, ours.cfg.d_vocab, (1, 16), device=device)
    warnings.simplefilter("ignore")
    with torch.inference_mode():
        for batch in (1, 32):
            ids = prompt.repeat(batch, 1)
            hf_gen = lambda ids=ids: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,  # noqa: E731
                                                 min_new_tokens=new, do_sample=False, cache_implementation="static",
                                                 pad_token_id=0, disable_compile=True)
            ours_gen = lambda ids=ids: ours.generate(ids, new)  # noqa: E731
            same = torch.equal(hf_gen(), ours_gen())
            med = interleaved({"hf": hf_gen, "ours": ours_gen}, device, 3)
            print(f"batch {batch}: equal {same}; tokens/s interp {batch * new / med['ours']:.1f}, "
                  f"HF {batch * new / med['hf']:.1f}; ratio {med['hf'] / med['ours']:.3f} (target >= 1.2)", flush=True)


if __name__ == "__main__":
    main()
