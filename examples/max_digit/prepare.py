"""Write an outcome-only task as a dataset of chat prompts: name the largest of three digits.

    python prepare.py [--out .]

writes ``data/train.parquet`` and ``data/val.parquet`` (the 1,000 strings of three digits, 200
held out: ``prompt`` is a list of chat messages, ``[{"role": "user", "content": "384"}]``,
the answer "8" is ``reward_model.ground_truth``) and ``model/``, a tiny GPT-2 with one token
per character whose tokenizer has a chat template (a user message ``384`` becomes
``<bos>384=``). The reward (``reward.py``) is the outcome alone: 1 for the right digit, 0
otherwise, with no credit for being close.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sc_trainer.tasks import save_tiny_gpt2

HELD_OUT = 200
#: the chat template: the user's message after <bos>, then "=" where the answer goes
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}={% endif %}"
)


def rows(strings: list[str], split: str) -> list[dict[str, object]]:
    return [
        {
            "data_source": "max_digit",
            "prompt": [{"role": "user", "content": s}],
            "ability": "compare",
            "reward_model": {"style": "rule", "ground_truth": max(s)},
            "extra_info": {"split": split, "index": i},
        }
        for i, s in enumerate(strings)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".", help="where data/ and model/ go (default: here)")
    out = Path(parser.parse_args().out)
    everything = [str(i).zfill(3) for i in range(1000)]
    order = np.random.default_rng(7).permutation(len(everything))
    val = [everything[i] for i in sorted(order[:HELD_OUT])]
    train = [everything[i] for i in sorted(order[HELD_OUT:])]
    (out / "data").mkdir(parents=True, exist_ok=True)
    for name, strings in (("train", train), ("val", val)):
        pq.write_table(pa.Table.from_pylist(rows(strings, name)), out / "data" / f"{name}.parquet")
    model = out / "model"
    save_tiny_gpt2(model, seed=0)
    transformers: Any = importlib.import_module("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(model))
    print(f"wrote {len(train)} training and {len(val)} validation prompts, and model/ in {out}")


if __name__ == "__main__":
    main()
