"""Prompt datasets in verl's schema (sc_trainer.data): parquet and JSON-lines files, the
tokenized dataset, and the prompt source's batches (no workers, no hub: the tokenizers are
built here)."""

from __future__ import annotations

import functools
import json
import logging
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_protocol import DataProto
from sc_trainer import TrainerConfigError
from sc_trainer.data import (
    DatasetError,
    DatasetNotFoundError,
    DatasetPrompts,
    DatasetStats,
    PromptDataset,
    load_rows,
)
from sc_trainer.rollout import PromptSource
from sc_trainer.tasks import build_char_tokenizer

#: a template that writes every message as <role>content and a newline, then <assistant>
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
CHARS = sorted(set(string.ascii_letters + string.digits + " \n:=<>|/?.,!-_+*"))
PAD, EOS, BOS = 0, 1, 2


@functools.cache
def _tokenizer(chat: bool = True) -> Any:
    """A character-level Hugging Face fast tokenizer (pad 0, eos 1, bos 2), with the chat
    template above when ``chat``."""
    tok = build_char_tokenizer(CHARS)
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def _chat(content: str, system: str | None = None) -> list[dict[str, str]]:
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": content}]


def _row(i: int, prompt: Any = None, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "data_source": "openai/gsm8k",
        "prompt": _chat(f"what is {i}+1?") if prompt is None else prompt,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        "extra_info": {"index": i, "split": "train"},
    }
    row.update(over)
    return row


def _write_parquet(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return path


def _write_jsonl(path: Path, rows: Sequence[Any], blank_line: bool = False) -> Path:
    lines = [json.dumps(r) for r in rows]
    if blank_line:
        lines.insert(1, "   ")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _rendered(messages: list[dict[str, str]]) -> str:
    return "<bos>" + "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"


def _dataset(rows: Sequence[dict[str, Any]], **kw: Any) -> PromptDataset:
    kw.setdefault("max_prompt_length", 64)
    tokenizer = _tokenizer(kw.pop("chat", True))
    return PromptDataset(rows, tokenizer, **kw)


@functools.cache
def _numbered(count: int) -> PromptDataset:
    """``count`` string prompts whose ground truth is their row index."""
    rows = [_row(i, prompt=f"q{i}", reward_model={"ground_truth": i}) for i in range(count)]
    return _dataset(rows, max_prompt_length=8)


def _same(a: DataProto, b: DataProto) -> bool:
    assert a.batch is not None
    assert b.batch is not None
    tensors = all(torch.equal(a.batch[k], b.batch[k]) for k in a.batch.keys())  # noqa: SIM118
    columns = set(a.non_tensor_batch) == set(b.non_tensor_batch) and all(
        list(a.non_tensor_batch[k]) == list(b.non_tensor_batch[k]) for k in a.non_tensor_batch
    )
    return tensors and columns and a.meta_info == b.meta_info


# -- files ---------------------------------------------------------------------------------


def test_parquet_in_verls_schema_with_chat_prompts(tmp_path: Path) -> None:
    rows = [_row(i) for i in range(3)]
    path = _write_parquet(tmp_path / "train.parquet", rows)
    schema = pq.read_schema(path)
    # as verl's files: the prompt a list of structs, reward_model and extra_info structs
    assert pa.types.is_list(schema.field("prompt").type)
    assert pa.types.is_struct(schema.field("prompt").type.value_type)
    assert pa.types.is_struct(schema.field("reward_model").type)
    assert load_rows(path) == rows
    assert load_rows([str(path)]) == rows

    ds = PromptDataset.from_files(path, _tokenizer(), max_prompt_length=64)
    assert len(ds) == 3
    assert ds.files == (str(path),)
    item = ds[2]
    text = _rendered(_chat("what is 2+1?"))
    assert item["prompt_text"] == text
    assert item["input_ids"] == _tokenizer().encode(text, add_special_tokens=False)
    assert item["input_ids"][0] == BOS
    assert item["ground_truth"] == "3"
    assert item["data_source"] == "openai/gsm8k"
    assert item["ability"] == "math"
    assert item["extra_info"] == {"index": 2, "split": "train"}
    assert item["row_index"] == 2


def test_json_lines_with_string_prompts(tmp_path: Path) -> None:
    rows = [_row(0, prompt="abc"), _row(1, prompt="<bos>abc"), _row(2, prompt="x y")]
    for suffix in (".jsonl", ".json", ".JSONL"):
        path = _write_jsonl(tmp_path / f"train{suffix}", rows, blank_line=True)
        assert load_rows(path) == rows
    ds = PromptDataset.from_files(tmp_path / "train.jsonl", _tokenizer(), max_prompt_length=16)
    letters = _tokenizer().encode("abc", add_special_tokens=False)
    # the tokenizer's bos first, once: added to "abc", not again to "<bos>abc"
    assert ds[0]["input_ids"] == [BOS, *letters]
    assert ds[1]["input_ids"] == [BOS, *letters]
    assert [ds[i]["prompt_text"] for i in range(3)] == ["abc", "<bos>abc", "x y"]


def test_string_prompts_without_a_bos_token_are_encoded_as_they_are() -> None:
    tok = _FakeTokenizer()
    ds = PromptDataset([_row(0, prompt="a b c")], tok, max_prompt_length=8)
    assert ds[0]["input_ids"] == [3, 3, 3]


def test_several_files_concatenate_in_order(tmp_path: Path) -> None:
    first = _write_parquet(tmp_path / "a.parquet", [_row(0), _row(1)])
    second = _write_jsonl(tmp_path / "b.jsonl", [_row(2, prompt="two"), _row(3, prompt="three")])
    rows = load_rows([first, second])
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2, 3]
    ds = PromptDataset.from_files([first, second], _tokenizer(), max_prompt_length=64)
    assert [ds[i]["row_index"] for i in range(4)] == [0, 1, 2, 3]
    assert ds[3]["prompt_text"] == "three"
    assert ds.files == (str(first), str(second))
    # a bad row of the second file is named by its file, its row there and in the dataset
    bad = _write_jsonl(tmp_path / "c.jsonl", [_row(4, prompt="ok"), _row(5, prompt=7)])
    with pytest.raises(DatasetError, match=r"c\.jsonl row 1 \(dataset row 3\).*int 7"):
        PromptDataset.from_files([first, bad], _tokenizer(), max_prompt_length=64)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    there = _write_jsonl(tmp_path / "there.jsonl", [_row(0)])
    missing = tmp_path / "missing.parquet"
    with pytest.raises(DatasetNotFoundError, match=r"missing\.parquet: no such data file"):
        load_rows([there, missing])
    with pytest.raises(FileNotFoundError):
        PromptDataset.from_files(missing, _tokenizer(), max_prompt_length=8)


def test_another_suffix_or_no_file_is_refused(tmp_path: Path) -> None:
    csv = tmp_path / "train.csv"
    csv.write_text("prompt\nhi\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"train\.csv: unknown data file format '\.csv'"):
        load_rows(csv)
    with pytest.raises(DatasetError, match="no data file given"):
        load_rows([])
    with pytest.raises(DatasetError, match="must be a path, got 3"):
        load_rows([3])  # type: ignore[list-item]


def test_a_file_without_the_prompt_column_names_its_columns(tmp_path: Path) -> None:
    rows = [{k: v for k, v in _row(i).items() if k != "prompt"} for i in range(2)]
    path = _write_parquet(tmp_path / "noprompt.parquet", rows)
    with pytest.raises(DatasetError, match=r"noprompt\.parquet: no prompt column 'prompt'") as e:
        load_rows(path)
    assert "['data_source', 'ability', 'reward_model', 'extra_info']" in str(e.value)
    # another prompt_key reads it
    assert len(load_rows(path, prompt_key="data_source")) == 2
    # JSON lines: any row without it
    lines = [_row(0), {"data_source": "x", "question": "hi"}]
    jsonl = _write_jsonl(tmp_path / "half.jsonl", lines)
    with pytest.raises(DatasetError, match=r"half\.jsonl line 2 \(row 1\): no prompt column"):
        load_rows(jsonl)


def test_rows_given_directly_without_the_prompt_key() -> None:
    with pytest.raises(DatasetError, match=r"<rows> row 0: no prompt column 'question'"):
        _dataset([_row(0)], prompt_key="question")


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("bad.parquet", b"PAR1 this is not parquet", "cannot read the parquet file"),
        ("bad.jsonl", b'{"prompt": "a"}\n{"prompt": \n', r"line 2 \(row 1\): not valid JSON"),
        ("list.jsonl", b'["prompt", "a"]\n', r"line 1 \(row 0\): a row must be a JSON object"),
        ("latin.jsonl", b'{"prompt": "\xe9"}\n', "cannot read the JSON-lines file"),
        ("empty.jsonl", b"\n\n", "holds no rows"),
    ],
)
def test_an_unreadable_file_is_a_dataset_error(
    tmp_path: Path, name: str, content: bytes, match: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DatasetError, match=match) as e:
        load_rows(path)
    assert name in str(e.value)
    if "cannot read" in match or "not valid" in match:
        assert e.value.__cause__ is not None


def test_an_empty_parquet_file_holds_no_rows(tmp_path: Path) -> None:
    table = pa.table({"prompt": pa.array([], type=pa.string())})
    pq.write_table(table, tmp_path / "empty.parquet")
    with pytest.raises(DatasetError, match=r"empty\.parquet: the data file holds no rows"):
        load_rows(tmp_path / "empty.parquet")


# -- the tokenized dataset -----------------------------------------------------------------


def test_the_chat_template_is_applied() -> None:
    messages = _chat("add 2 and 3", system="be brief")
    ds = _dataset([_row(0, prompt=messages)])
    text = _rendered(messages)
    assert ds[0]["prompt_text"] == text
    assert "<system>be brief\n<user>add 2 and 3\n<assistant>" in text
    tok = _tokenizer()
    assert ds[0]["input_ids"] == tok.encode(text, add_special_tokens=False)
    # the template's bos only, not a second one
    assert ds[0]["input_ids"].count(BOS) == 1


def test_none_fields_of_parquet_messages_are_dropped(tmp_path: Path) -> None:
    rows = [
        _row(0, prompt=[{"role": "user", "content": "hi", "name": None}]),
        _row(1, prompt=[{"role": "user", "content": "yo", "name": "bob"}]),
    ]
    path = _write_parquet(tmp_path / "names.parquet", rows)
    # parquet gives every message the same fields: None where the message had none
    assert load_rows(path)[0]["prompt"] == [{"role": "user", "content": "hi", "name": None}]
    fake = _FakeTokenizer()
    PromptDataset.from_files(path, fake, max_prompt_length=16)
    assert fake.seen == [
        [{"role": "user", "content": "hi"}],
        [{"role": "user", "content": "yo", "name": "bob"}],
    ]
    tok = build_char_tokenizer(CHARS)
    tok.chat_template = (
        "{% for m in messages %}{{ m.get('name', '-') }}:{{ m.content }}{% endfor %}"
    )
    ds = PromptDataset.from_files(path, tok, max_prompt_length=16)
    assert [ds[0]["prompt_text"], ds[1]["prompt_text"]] == ["-:hi", "bob:yo"]


def test_overlong_prompts_are_filtered_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    # lengths with the bos: 5, 9, 3, 12
    rows = [_row(i, prompt=p) for i, p in enumerate(["abcd", "abcdefgh", "ab", "abcdefghijk"])]
    with caplog.at_level(logging.INFO, logger="sc_trainer.data"):
        ds = _dataset(rows, max_prompt_length=9)
    assert ds.stats == DatasetStats(read=4, kept=3, filtered=1, truncated=0)
    assert [ds[i]["row_index"] for i in range(len(ds))] == [0, 1, 2]
    assert "4 rows read, 3 kept, 1 filtered (longer than 9 tokens), 0 truncated" in caplog.text


@pytest.mark.parametrize("side", ["left", "right"])
def test_truncation_keeps_one_end_and_is_counted(side: str) -> None:
    rows = [_row(0, prompt="abcdefgh"), _row(1, prompt="ab")]
    ds = _dataset(rows, max_prompt_length=4, filter_overlong_prompts=False, truncation=side)
    full = [BOS, *_tokenizer().encode("abcdefgh", add_special_tokens=False)]
    assert ds[0]["input_ids"] == (full[-4:] if side == "left" else full[:4])
    assert ds[0]["prompt_text"] == "abcdefgh"
    assert len(ds[1]["input_ids"]) == 3
    assert ds.stats == DatasetStats(read=2, kept=2, filtered=0, truncated=1)


def test_truncation_error_names_the_row_and_its_length() -> None:
    rows = [_row(0, prompt="ab"), _row(1, prompt="abcdefgh")]
    with pytest.raises(DatasetError, match=r"<rows> row 1: the prompt is 9 tokens.*=4") as e:
        _dataset(rows, max_prompt_length=4, filter_overlong_prompts=False)
    assert "'abcdefgh'" in str(e.value)


def test_a_dataset_that_keeps_no_row() -> None:
    with pytest.raises(DatasetError, match=r"no row kept of 1 \(1 longer than max_prompt_length=2"):
        _dataset([_row(0, prompt="abcdef")], max_prompt_length=2)


def test_rows_without_ground_truth_are_all_counted(tmp_path: Path) -> None:
    good = [_row(i) for i in range(4)]
    bad = [_row(i, reward_model={"style": "rule", "ground_truth": None}) for i in range(4, 10)]
    no_model = [{k: v for k, v in _row(10).items() if k != "reward_model"}]
    rows = [*good, *bad, *no_model]
    path = _write_jsonl(tmp_path / "gt.jsonl", rows)
    with pytest.raises(
        DatasetError, match=r"^7 of 11 rows have no reward_model\.ground_truth"
    ) as e:
        PromptDataset.from_files(path, _tokenizer(), max_prompt_length=64)
    message = str(e.value)
    for i in range(4, 9):  # the first five quoted, with the file and the value
        assert f"gt.jsonl row {i}: reward_model={{'style': 'rule', 'ground_truth': None}}" in (
            message
        )
    assert "row 9:" not in message
    assert "row 3:" not in message
    assert message.endswith("and 2 more")
    # without the requirement the rows are kept, with no ground truth
    ds = PromptDataset.from_files(
        path, _tokenizer(), max_prompt_length=64, require_ground_truth=False
    )
    assert len(ds) == 11
    assert ds[10]["ground_truth"] is None
    assert ds[0]["ground_truth"] == "1"


def test_rows_need_the_reward_fn_key() -> None:
    rows = [_row(0), _row(1, data_source=None), {**_row(2), "data_source": 3}]
    with pytest.raises(DatasetError, match=r"2 of 3 rows have no string 'data_source'") as e:
        _dataset(rows)
    assert "row 1: data_source=None" in str(e.value)
    assert "row 2: data_source=3" in str(e.value)
    renamed = [_row(i, source=f"src{i}") for i in range(2)]
    ds = _dataset(renamed, reward_fn_key="source")
    assert [ds[0]["data_source"], ds[1]["data_source"]] == ["src0", "src1"]


@pytest.mark.parametrize(
    ("prompt", "match"),
    [
        ({"role": "user", "content": "hi"}, "must be a string or a list of chat messages"),
        (42, "must be a string or a list of chat messages .*, got int 42"),
        ([], "an empty list of chat messages"),
        (["hi"], "message 0 of the prompt is not a dict.*'hi'"),
        ([{"role": "user"}], "message 0 .*needs a string 'role' and a string 'content'"),
        (
            [{"role": "user", "content": "a"}, {"role": 1, "content": "b"}],
            "message 1 .*'role': 1",
        ),
        ("", "the prompt is empty after tokenizing"),
    ],
)
def test_a_malformed_prompt_names_the_row(prompt: Any, match: str) -> None:
    rows = [_row(0), _row(1, prompt=prompt)]
    with pytest.raises(DatasetError, match=r"<rows> row 1: .*" + match):
        _dataset(rows)


def test_messages_need_a_tokenizer_with_a_chat_template() -> None:
    with pytest.raises(DatasetError, match=r"row 0: .*the tokenizer has no chat template"):
        _dataset([_row(0)], chat=False)
    # string prompts need none
    assert len(_dataset([_row(0, prompt="hi")], chat=False)) == 1


def test_a_chat_template_that_fails() -> None:
    tok = build_char_tokenizer(CHARS)
    tok.chat_template = "{{ raise_exception('no system messages') }}"
    with pytest.raises(DatasetError, match="row 0: the tokenizer's chat template cannot") as e:
        PromptDataset([_row(0)], tok, max_prompt_length=64)
    assert e.value.__cause__ is not None
    assert "no system messages" in str(e.value)


class _FakeTokenizer:
    """A duck-typed tokenizer: one token (3) per word, no bos; ``fail`` in a text raises; its
    chat template renders ``rendered`` and records the messages it was given."""

    pad_token_id: int | None = None
    eos_token_id: int | None = 1
    bos_token_id: int | None = None
    chat_template: str | None = "fake"

    def __init__(self, rendered: Any = "a b") -> None:
        self.rendered = rendered
        self.seen: list[Any] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if "fail" in text:
            raise RuntimeError("cannot encode this")
        return [3 for _ in text.split()]

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
        assert kwargs == {"add_generation_prompt": True, "tokenize": False}
        self.seen.append(messages)
        return self.rendered


def test_a_row_that_cannot_be_tokenized() -> None:
    with pytest.raises(DatasetError, match="row 1: the prompt cannot be tokenized") as e:
        PromptDataset(
            [_row(0, prompt="ok"), _row(1, prompt="fail")], _FakeTokenizer(), max_prompt_length=4
        )
    assert isinstance(e.value.__cause__, RuntimeError)
    with pytest.raises(DatasetError, match="row 0: the chat template rendered list"):
        PromptDataset([_row(0)], _FakeTokenizer(rendered=[1, 2]), max_prompt_length=4)


def test_the_pad_token_falls_back_to_eos() -> None:
    tok = _FakeTokenizer()
    ds = PromptDataset([_row(0, prompt="a")], tok, max_prompt_length=4)
    assert ds.pad_token_id == 1
    source = DatasetPrompts(ds, batch_size=1, shuffle=False)
    batch = source.train_batch(1)
    assert batch.batch is not None
    assert batch.batch["input_ids"].tolist() == [[1, 1, 1, 3]]
    tok.eos_token_id = None
    no_pad = PromptDataset([_row(0, prompt="a")], tok, max_prompt_length=4)
    assert no_pad.pad_token_id is None
    with pytest.raises(TrainerConfigError, match="neither a pad nor an eos token"):
        DatasetPrompts(no_pad, batch_size=1)
    with pytest.raises(TrainerConfigError, match="neither a pad nor an eos token"):
        no_pad.batch([0], uid_prefix="x")
    explicit = DatasetPrompts(no_pad, batch_size=1, pad_token_id=7).train_batch(1)
    assert explicit.batch is not None
    assert explicit.batch["input_ids"].tolist() == [[7, 7, 7, 3]]


def test_extra_info_and_ability_types() -> None:
    with pytest.raises(DatasetError, match="row 0: extra_info must be a dict, got 'x'"):
        _dataset([_row(0, extra_info="x")])
    with pytest.raises(DatasetError, match="row 0: ability must be a string, got 3"):
        _dataset([_row(0, ability=3)])
    ds = _dataset([_row(0, extra_info=None, ability=None)])
    assert ds[0]["extra_info"] is None
    assert ds[0]["ability"] is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_prompt_length": 0}, "max_prompt_length must be at least 1"),
        ({"max_prompt_length": 2.5}, "max_prompt_length must be an int"),
        ({"truncation": "middle"}, "truncation must be one of"),
        ({"origins": [("f", 0), ("f", 1)]}, "2 origins for 1 rows"),
    ],
)
def test_dataset_settings_out_of_range(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TrainerConfigError, match=match):
        _dataset([_row(0)], **kwargs)


# -- the prompt source ---------------------------------------------------------------------


def test_a_training_batch_has_the_columns_the_trainer_reads() -> None:
    rows = [
        _row(0, prompt="ab"),
        _row(1, prompt=_chat("x"), reward_model={"ground_truth": ["7", "8"]}, extra_info=None),
        _row(2, prompt="abcd", reward_model={"ground_truth": ["9", "1"]}),
    ]
    ds = _dataset(rows, max_prompt_length=20)
    source = DatasetPrompts(ds, batch_size=3, responses_per_prompt=2, shuffle=False)
    assert isinstance(source, PromptSource)
    batch = source.train_batch(1)
    assert batch.batch is not None
    assert len(batch) == 6
    assert set(batch.batch.keys()) == {"input_ids", "attention_mask", "position_ids"}
    assert set(batch.non_tensor_batch) == {
        "uid",
        "data_source",
        "ground_truth",
        "extra_info",
        "ability",
        "prompt_text",
        "row_index",
    }
    assert batch.meta_info == {"global_step": 1}
    ids, mask, pos = (batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    assert ids.shape == mask.shape == pos.shape == (6, 20)
    assert ids.dtype == mask.dtype == pos.dtype == torch.long
    for r in range(6):
        prompt = ds[r // 2]["input_ids"]
        # left-padded: pads, then the prompt's tokens at the right end
        assert ids[r].tolist() == [PAD] * (20 - len(prompt)) + prompt
        assert mask[r].tolist() == [0] * (20 - len(prompt)) + [1] * len(prompt)
    assert torch.equal(pos, (mask.cumsum(1) - 1).clamp(min=0))
    assert pos[0].tolist()[-3:] == [0, 1, 2]
    columns = batch.non_tensor_batch
    assert all(c.dtype == object and c.shape == (6,) for c in columns.values())
    # the repeats of a prompt are adjacent and share its uid
    assert list(columns["uid"]) == ["s1-0", "s1-0", "s1-1", "s1-1", "s1-2", "s1-2"]
    assert list(columns["row_index"]) == [0, 0, 1, 1, 2, 2]
    truths = ["1", "1", ["7", "8"], ["7", "8"], ["9", "1"], ["9", "1"]]
    assert list(columns["ground_truth"]) == truths
    assert list(columns["extra_info"][::2]) == [
        {"index": 0, "split": "train"},
        None,
        {"index": 2, "split": "train"},
    ]
    assert list(columns["data_source"]) == ["openai/gsm8k"] * 6
    assert list(columns["ability"]) == ["math"] * 6
    assert columns["prompt_text"][2] == _rendered(_chat("x"))
    assert columns["prompt_text"][0] == "ab"


def test_epochs_in_order_drop_the_incomplete_batch() -> None:
    source = DatasetPrompts(_numbered(10), batch_size=3, shuffle=False)
    assert source.steps_per_epoch == 3
    assert [source.indices(s) for s in range(1, 5)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 2]]
    assert source.position(4) == {
        "step": 4,
        "epoch": 1,
        "batch": 0,
        "steps_per_epoch": 3,
        "rows_consumed": 12,
    }
    assert source.position(3)["epoch"] == 0
    assert source.position(3)["batch"] == 2
    batch = source.train_batch(2)
    assert list(batch.non_tensor_batch["row_index"]) == [3, 4, 5]
    assert list(batch.non_tensor_batch["ground_truth"]) == [3, 4, 5]


def test_shuffled_epochs_are_numpy_permutations_of_seed_and_epoch() -> None:
    source = DatasetPrompts(_numbered(12), batch_size=4, seed=5)
    for epoch in (0, 1, 2):
        expected = np.random.default_rng([5, epoch]).permutation(12)
        assert source.order(epoch).tolist() == expected.tolist()
        steps = range(epoch * 3 + 1, epoch * 3 + 4)
        assert [i for s in steps for i in source.indices(s)] == expected.tolist()
    assert source.order(0).tolist() != source.order(1).tolist()
    other_seed = DatasetPrompts(_numbered(12), batch_size=4, seed=6)
    assert other_seed.order(0).tolist() != source.order(0).tolist()


@settings(deadline=None, max_examples=40)
@given(
    size=st.integers(min_value=1, max_value=20),
    batch_size=st.integers(min_value=1, max_value=20),
    seed=st.integers(min_value=0, max_value=2**32),
    shuffle=st.booleans(),
    epoch=st.integers(min_value=0, max_value=50),
    n=st.integers(min_value=1, max_value=3),
)
def test_each_step_is_a_pure_function_and_an_epoch_covers_each_row_once(
    size: int, batch_size: int, seed: int, shuffle: bool, epoch: int, n: int
) -> None:
    if batch_size > size:
        with pytest.raises(DatasetError, match="fewer than one batch"):
            DatasetPrompts(_numbered(size), batch_size=batch_size)
        return
    data = _numbered(size)
    source = DatasetPrompts(
        data, batch_size=batch_size, seed=seed, shuffle=shuffle, responses_per_prompt=n
    )
    steps = range(epoch * source.steps_per_epoch + 1, (epoch + 1) * source.steps_per_epoch + 1)
    seen = [i for s in steps for i in source.indices(s)]
    # each kept row at most once, all but the dropped remainder
    assert len(seen) == len(set(seen)) == source.steps_per_epoch * batch_size
    assert len(seen) > size - batch_size
    if size % batch_size == 0:
        assert sorted(seen) == list(range(size))
    # the batch of a step, computed again by another source after other steps, is the same
    step = steps[-1]
    again = DatasetPrompts(
        data, batch_size=batch_size, seed=seed, shuffle=shuffle, responses_per_prompt=n
    )
    again.train_batch(1)
    assert _same(source.train_batch(step), again.train_batch(step))
    assert list(again.train_batch(step).non_tensor_batch["ground_truth"][::n]) == (
        source.indices(step)
    )


def test_a_train_set_smaller_than_one_batch(tmp_path: Path) -> None:
    rows = [_row(i, prompt="a" * (i * 4)) for i in range(1, 5)]  # lengths 5, 9, 13, 17
    path = _write_parquet(tmp_path / "small.parquet", rows)
    ds = PromptDataset.from_files(path, _tokenizer(), max_prompt_length=10)
    with pytest.raises(DatasetError, match=r"small\.parquet: the training data keeps 2") as e:
        DatasetPrompts(ds, batch_size=3)
    assert "of 4 rows read, 2 filtered" in str(e.value)
    assert "batch_size=3" in str(e.value)


def test_the_validation_batch() -> None:
    train = _numbered(6)
    val_rows = [_row(i, prompt=f"v{i}") for i in range(5)]
    val = _dataset(val_rows, max_prompt_length=6)
    batch = DatasetPrompts(train, val, batch_size=2, responses_per_prompt=4).val_batch()
    assert len(batch) == 5
    assert batch.meta_info == {"do_sample": False}
    assert list(batch.non_tensor_batch["uid"]) == [f"val-{i}" for i in range(5)]
    assert list(batch.non_tensor_batch["prompt_text"]) == [f"v{i}" for i in range(5)]
    assert batch.batch is not None
    assert batch.batch["input_ids"].shape == (5, 6)
    with pytest.raises(DatasetError, match="no validation data"):
        DatasetPrompts(train, batch_size=2).val_batch()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size must be an int >= 1, got 0"),
        ({"batch_size": True}, "batch_size must be an int"),
        ({"responses_per_prompt": 0}, "responses_per_prompt must be an int >= 1"),
        ({"seed": -1}, "seed must be an int >= 0, got -1"),
        ({"pad_token_id": -2}, "pad_token_id must be an int >= 0"),
    ],
)
def test_prompt_source_settings_out_of_range(kwargs: dict[str, Any], match: str) -> None:
    kwargs.setdefault("batch_size", 2)
    with pytest.raises(TrainerConfigError, match=match):
        DatasetPrompts(_numbered(4), **kwargs)


def test_steps_count_from_one() -> None:
    source = DatasetPrompts(_numbered(4), batch_size=2)
    with pytest.raises(TrainerConfigError, match="step must be an int >= 1, got 0"):
        source.train_batch(0)
    with pytest.raises(TrainerConfigError, match="step must be an int >= 1"):
        source.position(-3)


def test_the_fingerprint_follows_the_data(tmp_path: Path) -> None:
    rows = [_row(i) for i in range(4)]
    a = PromptDataset.from_files(
        _write_parquet(tmp_path / "a.parquet", rows), _tokenizer(), max_prompt_length=64
    )
    b = PromptDataset.from_files(
        _write_jsonl(tmp_path / "b.jsonl", rows), _tokenizer(), max_prompt_length=64
    )
    assert a.fingerprint == b.fingerprint
    assert len(a.fingerprint) == 16
    int(a.fingerprint, 16)
    changed = [*rows[:3], _row(3, reward_model={"ground_truth": "other"})]
    assert _dataset(changed).fingerprint != a.fingerprint
    reordered = [rows[1], rows[0], *rows[2:]]
    assert _dataset(reordered).fingerprint != a.fingerprint
    # another tokenization (a shorter limit that truncates) is other data
    cut = _dataset(rows, max_prompt_length=8, filter_overlong_prompts=False, truncation="left")
    assert cut.fingerprint != a.fingerprint
    assert DatasetPrompts(a, batch_size=2).fingerprint == a.fingerprint


def test_the_public_names() -> None:
    import sc_trainer.data as data

    assert data.__all__ == sorted(data.__all__)
    assert data.__all__ == [
        "DatasetError",
        "DatasetNotFoundError",
        "DatasetPrompts",
        "DatasetStats",
        "PromptDataset",
        "load_rows",
    ]
    assert PromptDataset.__module__ == "sc_trainer.data"
    assert DatasetPrompts.__module__ == "sc_trainer.data"
    assert issubclass(DatasetError, ValueError)
    assert issubclass(DatasetNotFoundError, FileNotFoundError)
