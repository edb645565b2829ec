"""Trains `builtin:tiny-llama`, the small Llama-architecture model shipped with HexStudio.

    PYTHONPATH=. .venv/bin/python tools/builtin_model/train_tiny_llama.py [--steps 1500] [--threads 2]

Writes workers/shared/data/builtin_model/tiny-llama/ (package data) in Hugging Face layout: config.json,
model.safetensors (float16), generation_config.json, tokenizer.json and
tokenizer_config.json with a Llama-3-style chat template. The corpus is project-written
(make_corpus.py, beside this script); see workers/shared/data/builtin_model/PROVENANCE.md. Deterministic for a given seed and thread count.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "workers" / "shared" / "data" / "builtin_model"   # a checkout's package data
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
    args = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    import make_corpus

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.set_num_threads(args.threads)
    text_dir = DATA / "text"
    make_corpus.main(text_dir)
    tok = train_tokenizer(text_dir / "train.txt", 2048)
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))  # type: ignore[attr-defined]
    fast = PreTrainedTokenizerFast(tokenizer_file=str(OUT / "tokenizer.json"), bos_token="<|begin_of_text|>",
                                   eos_token="<|eot_id|>", pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(OUT))
    ids = fast.convert_tokens_to_ids(SPECIAL)
    bos, eot_text, eot = ids[0], ids[1], ids[4]

    data = torch.tensor(fast(text_dir.joinpath("train.txt").read_text(), add_special_tokens=False)["input_ids"])
    print(f"corpus: {len(data):,} tokens")
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
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
    model.to(torch.float16).save_pretrained(str(OUT), safe_serialization=True)
    portable_layout(OUT)
    prompt = fast("Emma found a small board in the", return_tensors="pt")
    with torch.no_grad():
        out = model.to(torch.float32).generate(**prompt, max_new_tokens=20, do_sample=False)
    sample = fast.decode(out[0])
    print("sample:", sample)
    (OUT / "training.json").write_text(json.dumps({
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
