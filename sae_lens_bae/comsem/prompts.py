"""ComSem's prompts: templates kept as package data, and the parsing of the LLM's replies.

The explainer sees tokens (with position and text) and must answer one specific phrase; the
judge sees the phrase and one token in its text and must answer Yes or No. Neither ever reads or
writes an activation value. The wording lives in ``templates/explain.json`` and
``templates/judge.json``; a user overrides either by putting a file of the same name and shape in
a folder passed as ``templates=``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sae_lens_bae.comsem.samples import Sample
from sae_lens_bae.reports import read_json

__all__ = ["Templates", "load_templates", "parse_explanation", "parse_judgement"]

Message = dict[str, str]

_EXPLAIN_KEYS = ("system", "record", "user", "examples", "forbidden", "max_words")
_JUDGE_KEYS = ("system", "user", "examples", "content_free")


@dataclass(frozen=True)
class Templates:
    """The explainer's and the judge's templates (see the package's ``templates/*.json``)."""

    explain: dict[str, Any]
    judge: dict[str, Any]

    def _records(self, samples: list[dict[str, Any]] | list[Sample]) -> str:
        blocks = []
        for i, sample in enumerate(samples, 1):
            fields = sample if isinstance(sample, dict) else sample.prompt_fields()
            blocks.append(f"{i}. " + self.explain["record"].format(**fields))
        return "\n\n".join(blocks)

    def explain_messages(self, samples: list[Sample]) -> list[Message]:
        """System instruction, the few-shot examples as user/assistant turns, then the records."""
        messages = [{"role": "system", "content": self.explain["system"]}]
        for example in self.explain["examples"]:
            user = self.explain["user"].format(records=self._records(example["records"]))
            messages += [
                {"role": "user", "content": user},
                {"role": "assistant", "content": example["answer"]},
            ]
        user = self.explain["user"].format(records=self._records(samples))
        return [*messages, {"role": "user", "content": user}]

    def judge_messages(self, description: str, sample: Sample | None) -> list[Message]:
        """The judge's question for one record; ``sample=None`` asks it on the content-free input
        (for calibration)."""
        messages = [{"role": "system", "content": self.judge["system"]}]
        for example in self.judge["examples"]:
            messages += [
                {"role": "user", "content": self.judge["user"].format(**example)},
                {"role": "assistant", "content": example["answer"]},
            ]
        fields = self.judge["content_free"] if sample is None else sample.prompt_fields()
        user = self.judge["user"].format(description=description, **fields)
        return [*messages, {"role": "user", "content": user}]


def _read(folder: Path | None, name: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """The user's ``folder/name`` (checked for ``keys``) where it exists, else the package's."""
    if folder is not None and (Path(folder) / name).exists():
        fix = f"copy the package's templates/{name} and edit it"
        return read_json(Path(folder) / name, "a ComSem template", fix, keys)
    packaged = resources.files("sae_lens_bae.comsem").joinpath("templates", name)
    return json.loads(packaged.read_text())


def load_templates(folder: str | Path | None = None) -> Templates:
    """The package's templates, each replaced by ``folder/explain.json`` or
    ``folder/judge.json`` where those exist."""
    if folder is not None and not Path(folder).is_dir():
        raise FileNotFoundError(f"Template folder {folder} does not exist")
    where = None if folder is None else Path(folder)
    return Templates(
        explain=_read(where, "explain.json", _EXPLAIN_KEYS),
        judge=_read(where, "judge.json", _JUDGE_KEYS),
    )


_PREFIX = re.compile(r"^(description|answer|phrase|explanation|common theme)\s*:\s*", re.I)


def parse_explanation(reply: str | None, templates: Templates) -> str | None:
    """The phrase of an explainer reply, or None when it is not one usable phrase: empty, several
    lines, longer than ``max_words``, or a generic label from ``forbidden``."""
    if not reply:
        return None
    lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
    if len(lines) != 1:
        return None
    phrase = _PREFIX.sub("", lines[0]).strip().strip("*").strip().rstrip(".").strip()
    while len(phrase) >= 2 and phrase[0] == phrase[-1] and phrase[0] in "\"'`":
        phrase = phrase[1:-1].strip()  # a quoted phrase, not a phrase that ends in a quote
    if not phrase or len(phrase.split()) > int(templates.explain["max_words"]):
        return None
    if phrase.lower() in {label.lower() for label in templates.explain["forbidden"]}:
        return None
    return phrase


def parse_judgement(reply: str | None) -> bool | None:
    """True for Yes, False for No, None for anything else (an invalid reply, never a No)."""
    if reply is None:
        return None
    word = reply.strip().strip("\"'`*.!").strip().lower()
    return {"yes": True, "no": False}.get(word)
