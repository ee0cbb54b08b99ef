"""ComSem with a real (small) LLM served offline: SmolLM2-135M-Instruct behind the loopback
OpenAI-compatible server, judging the records of several models.

    python benchmarks/comsem_local_llm.py runs/compare/records/bae.safetensors \\
        runs/compare/records/standard.safetensors --max-features 40 --out runs/comsem_local

Where a real endpoint is reachable use ``bae interpret --base-url`` instead; this script exists so
that the whole path (prompts, a model's free-form replies, invalid-reply handling, scores) can be
measured on a machine without internet. A 135M-parameter judge is weak: its scores say little
about the features, its invalid-reply rate says how well the prompts constrain a small model.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from sae_lens_bae.comsem import ClientConfig, ComSemConfig, comsem
from sae_lens_bae.comsem.loopback import LoopbackServer
from sae_lens_bae.features.records import FeatureRecords
from sae_lens_bae.models import _embedded_hf_dir, load_tokenizer


def _responder(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    @torch.no_grad()
    def respond(body: dict[str, Any]) -> str:
        ids = tokenizer.apply_chat_template(
            body["messages"], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        out = model.generate(
            **ids, max_new_tokens=int(body.get("max_tokens") or 32), do_sample=False
        )
        return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)

    return respond


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", type=Path)
    parser.add_argument("--max-features", type=int, default=40)
    parser.add_argument("--llm-dir", type=Path, default=None, help="HF chat model directory")
    parser.add_argument("--out", type=Path, default=Path("runs/comsem_local"))
    args = parser.parse_args()
    model_dir = args.llm_dir or _embedded_hf_dir("smollm2-135m")
    results = []
    with LoopbackServer(responder=_responder(model_dir)) as server:
        client = ClientConfig(model=model_dir.name, base_url=server.base_url, concurrency=2)
        for path in args.records:
            records = FeatureRecords.load(path)
            start = time.perf_counter()
            summary = comsem(
                records,
                load_tokenizer(records.info["model"]),
                client,
                ComSemConfig(max_features=args.max_features),
                out=args.out / path.stem,
            )
            keys = ("activated", "evaluated", "explained", "interpretable", "mean_score",
                    "invalid_explanations", "invalid_judgements", "judged_records")  # fmt: skip
            results.append(
                {
                    "records": path.stem,
                    "magnitude": records.magnitude,
                    **{k: summary[k] for k in keys},
                    "seconds": round(time.perf_counter() - start, 1),
                }  # fmt: skip
            )
    print(json.dumps(results, indent=2))
    (args.out / "local_llm.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
