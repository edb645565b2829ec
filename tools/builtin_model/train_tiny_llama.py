"""Trains `builtin:tiny-llama`, the small Llama-architecture model shipped with HexStudio.

    PYTHONPATH=. .venv/bin/python tools/builtin_model/train_tiny_llama.py [--steps 1500] [--threads 2]
    PYTHONPATH=. .venv/bin/python tools/builtin_model/train_tiny_llama.py --draft [--steps 800]

--draft trains `builtin:tiny-llama-draft` instead: one decoder layer of width 128 on the same corpus with the SAME
tokenizer (copied from tiny-llama, not retrained), the draft model of Genie's spd dialog for the built-in model.

Writes hexstudio/shared/data/builtin_model/tiny-llama/ (package data) in Hugging Face layout: config.json,
model.safetensors (float16), generation_config.json, tokenizer.json and
tokenizer_config.json with a Llama-3-style chat template. The corpus is project-written
(make_corpus.py, beside this script); see hexstudio/shared/data/builtin_model/PROVENANCE.md. Deterministic for a given seed and thread count.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "hexstudio" / "shared" / "data" / "builtin_model"   # a checkout's package data
OUT = DATA / "tiny-llama"
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<|pad|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def train_tokenizer(text_path: Path, vocab: int) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(text_path)], trainer)
    return tok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--draft", action="store_true", help="train the 1-layer draft model (same tokenizer)")
    args = ap.parse_args()
    out = DATA / "tiny-llama-draft" if args.draft else OUT

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    import make_corpus

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.set_num_threads(args.threads)
    text_dir = DATA / "text"
    make_corpus.main(text_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.draft:     # the target's own tokenizer: spd compares both models' logits token id by token id
        (out / "tokenizer.json").write_bytes((OUT / "tokenizer.json").read_bytes())
    else:
        tok = train_tokenizer(text_dir / "train.txt", 2048)
        tok.save(str(OUT / "tokenizer.json"))  # type: ignore[attr-defined]
    fast = PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"), bos_token="<|begin_of_text|>",
                                   eos_token="<|eot_id|>", pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    ids = fast.convert_tokens_to_ids(SPECIAL)
    bos, eot_text, eot = ids[0], ids[1], ids[4]

    data = torch.tensor(fast(text_dir.joinpath("train.txt").read_text(), add_special_tokens=False)["input_ids"])
    print(f"corpus: {len(data):,} tokens")
    width, ffn, layers, heads, kv_heads = (128, 384, 1, 2, 1) if args.draft else (256, 768, 4, 4, 2)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=width, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048,
                      rope_theta=500000.0, rms_norm_eps=1e-5, bos_token_id=bos, eos_token_id=[eot_text, eot],
                      pad_token_id=ids[5], tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    seq, batch = 128, 16
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        lr = 3e-3 * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(data) - seq - 1, (batch,))
        x = torch.stack([data[s:s + seq] for s in starts])
        x = torch.cat([torch.full((batch, 1), bos), x[:, :-1]], dim=1)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:5d} loss {loss.item():.3f} ({time.time() - t0:.0f} s)", flush=True)
    model.eval()
    model.generation_config.eos_token_id = [eot_text, eot]
    model.to(torch.float16).save_pretrained(str(out), safe_serialization=True)
    portable_layout(out)
    prompt = fast("Emma found a small board in the", return_tensors="pt")
    with torch.no_grad():
        gen = model.to(torch.float32).generate(**prompt, max_new_tokens=20, do_sample=False)
    sample = fast.decode(gen[0])
    print("sample:", sample)
    (out / "training.json").write_text(json.dumps({
        "steps": args.steps, "seed": args.seed, "threads": args.threads, "final_loss": round(loss.item(), 4),
        "train_seconds": round(time.time() - t0, 1), "corpus_tokens": len(data), "sample": sample,
    }, indent=2))


def portable_layout(out: Path) -> None:
    """Files readable by transformers 4.45 (the validated recipe) as well as 5.x: a top-level `rope_theta` beside
    5.x's `rope_parameters`, and the chat template inside tokenizer_config.json (5.x writes it to
    chat_template.jinja only) with a tokenizer class both versions know."""
    cfg = json.loads((out / "config.json").read_text())
    cfg["rope_theta"] = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))
    (out / "config.json").write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")
    tc = json.loads((out / "tokenizer_config.json").read_text())
    tc["chat_template"] = CHAT_TEMPLATE
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=2) + "\n")


if __name__ == "__main__":
    import sys
    sys.path.insert(0, str(HERE))
    main()
