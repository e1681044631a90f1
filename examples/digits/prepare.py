"""Write the digit task as a dataset in verl's schema, and the small model that learns it.

    python prepare.py [--out .]

writes ``data/train.parquet`` and ``data/val.parquet`` (every string of four digits, 256 held
out for validation: one row per prompt, ``prompt`` a plain string "3805=", the answer "5083"
as ``reward_model.ground_truth``) and ``model/``, a tiny GPT-2 with one token per character,
freshly initialised and saved with ``save_pretrained`` as a Hugging Face checkpoint would be.
Nothing is downloaded. ``reward.py`` scores a response; ``config.yaml`` trains on them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sc_trainer.tasks import save_tiny_gpt2

LENGTH = 4
HELD_OUT = 256


def rows(strings: list[str], split: str) -> list[dict[str, object]]:
    """verl's columns for each prompt: the answer is the digits reversed."""
    return [
        {
            "data_source": "digits/reverse",
            "prompt": f"{s}=",
            "ability": "reverse",
            "reward_model": {"style": "rule", "ground_truth": s[::-1]},
            "extra_info": {"split": split, "index": i},
        }
        for i, s in enumerate(strings)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".", help="where data/ and model/ go (default: here)")
    out = Path(parser.parse_args().out)
    everything = [str(i).zfill(LENGTH) for i in range(10**LENGTH)]
    order = np.random.default_rng(1234).permutation(len(everything))
    val = [everything[i] for i in sorted(order[:HELD_OUT])]
    train = [everything[i] for i in sorted(order[HELD_OUT:])]
    (out / "data").mkdir(parents=True, exist_ok=True)
    for name, strings in (("train", train), ("val", val)):
        pq.write_table(pa.Table.from_pylist(rows(strings, name)), out / "data" / f"{name}.parquet")
    save_tiny_gpt2(out / "model", seed=0)
    print(f"wrote {len(train)} training and {len(val)} validation prompts, and model/ in {out}")


if __name__ == "__main__":
    main()
