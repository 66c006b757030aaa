"""The PyTorch peer of privmix's training step, for `cargo xtask bench --train-only`.

Loads the GGUF file with transformers (`gguf_file=`, dequantised to f32),
applies PEFT LoRA (r 8, alpha 16, q_proj and v_proj, no dropout), and times
full AdamW steps (forward, backward, update) on R blocks of T input tokens,
the blocks privmix's `train_speed` example builds: token `i` of block `r` is
`(1 + 1009 r + 7919 i) mod vocab`, input the first T tokens, targets the
next T. Then (`--mode dpsgd`) the DP-SGD step with Opacus: per-sample
gradients (GradSampleModule through PrivacyEngine), clipping to norm 1,
Gaussian noise of multiplier 1, the same R blocks as one batch.

Prints one JSON line: engine, mode, threads, rows, seq, step_seconds,
tokens_per_s (one per timed step), losses.
"""

import argparse
import json
import os
import time

import torch


def blocks(rows, seq, vocab):
    data = [[(1 + 1009 * r + 7919 * i) % vocab for i in range(seq + 1)] for r in range(rows)]
    return torch.tensor(data, dtype=torch.long)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--mode", choices=["lora", "dpsgd"], default="lora")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(os.path.abspath(a.gguf))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    vocab = model.config.vocab_size
    model = get_peft_model(
        model,
        LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    model.train()
    data = blocks(a.rows, a.seq, vocab)
    x, y = data[:, :-1], data[:, 1:]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-4)

    if a.mode == "dpsgd":
        from opacus import PrivacyEngine
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(x, y), batch_size=a.rows)
        engine = PrivacyEngine()
        model, optimizer, loader = engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            poisson_sampling=False,
        )

    def step():
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        if a.mode == "dpsgd":
            # Per-example mean losses summed: Opacus's per-sample gradients
            # are then each example's own mean-loss gradient.
            per_token = torch.nn.functional.cross_entropy(
                logits.reshape(-1, vocab), y.reshape(-1), reduction="none"
            ).view(a.rows, a.seq)
            loss = per_token.mean(dim=1).mean()
        else:
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    seconds, losses = [], []
    for i in range(a.warmup + a.steps):
        start = time.perf_counter()
        losses.append(step())
        if i >= a.warmup:
            seconds.append(time.perf_counter() - start)
    tokens = a.rows * a.seq
    print(
        json.dumps(
            {
                "engine": "pytorch+peft" + ("+opacus" if a.mode == "dpsgd" else ""),
                "mode": a.mode,
                "threads": torch.get_num_threads(),
                "rows": a.rows,
                "seq": a.seq,
                "step_seconds": seconds,
                "tokens_per_s": [tokens / s for s in seconds],
                "losses": losses,
                "versions": {"torch": torch.__version__},
            }
        )
    )


if __name__ == "__main__":
    main()
