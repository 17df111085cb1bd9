"""The model card (README.md) of an export: what it is, how well it works, where it came from.

Everything in it is read from the artifacts themselves -- the calibrate
stage's metrics.json and quarl_quantization.json, the input artifacts'
manifests (their inputs, stage configs and git commits), the adapter
artifact's metadata, and this export's verification report -- so the card
cannot drift from what was actually run.
"""

from __future__ import annotations

import json
from collections import Counter

import yaml


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _lineage_rows(label: str, manifest: dict | None) -> list[str]:
    if not manifest:
        return [f"- **{label}**: not a quarl artifact (no manifest)"]
    rows = [
        (
            f"- **{label}**: `{manifest.get('uri')}` -- stage `{manifest.get('stage')}`, "
            f"git `{manifest.get('git_commit')}`, completed {manifest.get('completed')}"
        )
    ]
    for u in manifest.get("inputs") or []:
        rows.append(f"  - input: `{u}`")
    return rows


def model_card(
    *,
    name: str,
    layers: dict[str, str],
    quant_meta: dict,
    calib_metrics: dict | None,
    model_manifest: dict | None,
    adapter_manifest: dict | None,
    adapter_info: dict | None,
    verification: dict,
    export_config: dict,
    export_inputs: list[str],
    git_commit: str,
    merged: dict | None,
) -> str:
    counts = Counter(layers.values())
    source = quant_meta.get("source_model") or "unknown"
    tags = ["quarl", "quantized"] + sorted(counts) + (["compressed-tensors"] if verification.get("base") else [])
    front = {"library_name": "transformers", "tags": tags}
    if isinstance(source, str) and "/" in source and not source.startswith(("/", ".", "s3://")):
        front["base_model"] = source
    out = ["---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "", f"# {name}", ""]
    method = quant_meta.get("method", "unknown")
    out += [
        f"Weights quantized by quarl ({method}) from `{source}`: "
        + ", ".join(f"{n} layers {f}" for f, n in sorted(counts.items()))
        + ". Stored in compressed-tensors' checkpoint format, which vLLM and transformers load as is.",
        "",
    ]
    out += [
        "## Files",
        "",
        "| path | what |",
        "|---|---|",
        "| `./` | quantized base model (config.json `quantization_config`, safetensors, tokenizer) |",
    ]
    if adapter_info:
        out.append("| `adapter/` | PEFT LoRA adapter trained on the quantized base |")
    if merged:
        out.append(f"| `merged/` | LoRA merged into the {merged['base']} weights, re-quantized ({merged['method']}) |")
    out += ["| `export_report.json` | verification numbers and lineage |", ""]

    out += ["## Quantization", "", f"- method: **{method}**", f"- formats: {dict(sorted(counts.items()))}"]
    if calib_metrics:
        c = calib_metrics.get("calibration", {})
        d = c.get("data", {})
        out += [
            f"- calibration data: {d.get('calibration')} ({c.get('windows')} x {c.get('seq_len')} tokens)",
            f"- held-out data: {d.get('held_out', 'none')}",
        ]
        if c.get("gptq"):
            out.append(f"- GPTQ: {c['gptq']}")
        if c.get("awq"):
            out.append(f"- AWQ: {c['awq']}")
    recipe = quant_meta.get("recipe")
    if recipe:
        out += ["", "Recipe:", "", "```yaml", yaml.safe_dump(recipe, sort_keys=False).strip(), "```"]
    out.append("")

    out += ["## Metrics", ""]
    q = (calib_metrics or {}).get("quality") or {}
    if q:
        out += [
            "Quantized vs full-precision model on held-out text (calibrate stage):",
            "",
            "| metric | value |",
            "|---|---|",
        ]
        for k, label in (
            ("kl", "KL divergence full precision -> quantized, nats/token"),
            ("ppl", "perplexity, quantized"),
            ("ref_ppl", "perplexity, full precision"),
            ("tokens", "tokens"),
        ):
            if k in q:
                out.append(f"| {label} | {_fmt(q[k])} |")
        out.append("")
    mem = (calib_metrics or {}).get("memory")
    if mem:
        out += ["| storage format | params | MiB | bits/param |", "|---|---:|---:|---:|"]
        for f, r in sorted(mem["by_format"].items()):
            out.append(f"| {f} | {r['params']:,} | {r['bytes'] / 2**20:.2f} | {r['bits_per_param']:.3f} |")
        out.append("")
    if adapter_info:
        from quarl.artifacts import RESERVED

        am = {
            k: v
            for k, v in (adapter_manifest or {}).items()
            if k not in RESERVED and (v is None or isinstance(v, (int, float, str, bool, dict)))
        }
        out.append(
            f"Adapter: r={adapter_info['r']}, alpha={adapter_info['alpha']}, targets {adapter_info['target_modules']}."
        )
        if am:
            out += [
                "",
                "Recorded by the adapter's stage (artifact metadata):",
                "",
                "```json",
                json.dumps(am, indent=2, default=str)[:4000],
                "```",
            ]
        out.append("")

    out += [
        "## Verification",
        "",
        (
            "The export was decoded by compressed-tensors' own decompressors into a plain dense transformers "
            "model (and loaded by transformers' CompressedTensorsConfig(dequantize=True) path where that path "
            "applies) and compared with the in-memory quantized model on a fixed prompt:"
        ),
        "",
        "| checkpoint | loader | max abs logit delta | tolerance | max elem. rel. weight delta | argmax agreement |",
        "|---|---|---:|---:|---:|---:|",
    ]
    rows = []
    for key in ("base", "adapter", "merged"):
        v = verification.get(key)
        if not v:
            continue
        rows.append((key, v))
        t = v.get("transformers") or {}
        if "logits" in t:
            rows.append((f"{key} (transformers)", {**t, "tolerance": v["tolerance"], "weights": {}}))
    skipped = [
        f"{k}: {v['transformers']['skipped']}"
        for k, v in verification.items()
        if isinstance(v, dict) and "skipped" in (v.get("transformers") or {})
    ]
    for key, v in rows:
        w = v.get("weights", {})
        out.append(
            f"| {key} | {v['loader']} | {v['logits']['max_abs']:.3g} | "
            f"{v['tolerance']['logits_max_abs']:.3g} | {_fmt(w.get('max_elem_rel', '-'))} | "
            f"{v['logits']['argmax_agreement']:.3f} |"
        )
    if skipped:
        out += ["", "transformers' loader not run -- " + "; ".join(skipped)]
    if verification.get("base"):
        t = verification["base"]["tolerance"]
        out += [
            "",
            (
                f"Tolerances: {t['why']}; logits max|delta| <= {t['atol']} + {t['rtol']} x max|logit|; "
                f"weights element-wise |delta| <= {t['weights_elem_rtol']:.3g} x |w|."
            ),
        ]
    if merged and "vs_lora" in merged:
        out += [
            (
                f"Merged + re-quantized vs quantized base + LoRA: max abs logit delta "
                f"{merged['vs_lora']['max_abs']:.3g} (the cost of re-quantizing after the merge)."
            )
        ]
    out += ["Checksums (sha256) of every file are in `manifest.json`.", ""]

    out += [
        "## Lineage",
        "",
        f"- export inputs: {', '.join(f'`{u}`' for u in export_inputs)}",
        f"- export git commit: `{git_commit}`",
    ]
    out += _lineage_rows("model artifact", model_manifest)
    if adapter_manifest is not None or adapter_info:
        out += _lineage_rows("adapter artifact", adapter_manifest)
    if model_manifest and model_manifest.get("config"):
        out += [
            "",
            "Calibrate config:",
            "",
            "```yaml",
            yaml.safe_dump(model_manifest["config"], sort_keys=False).strip(),
            "```",
        ]
    if adapter_manifest and adapter_manifest.get("config"):
        out += [
            "",
            "Adapter stage config:",
            "",
            "```yaml",
            yaml.safe_dump(adapter_manifest["config"], sort_keys=False).strip(),
            "```",
        ]
    out += ["", "Export config:", "", "```yaml", yaml.safe_dump(export_config, sort_keys=False).strip(), "```", ""]

    out += [
        "## Usage",
        "",
        "```bash",
        "vllm serve <this directory>"
        + (" --enable-lora --lora-modules policy=<this directory>/adapter" if adapter_info else ""),
        "```",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM",
        "model = AutoModelForCausalLM.from_pretrained('<this directory>')  # compressed-tensors installed",
        "```",
        "",
    ]
    if any(f.startswith(("int2", "int3")) for f in counts):
        out += [
            (
                "Note: INT2/INT3 pack-quantized weights load in transformers/compressed-tensors; vLLM's "
                "WNA16 kernels serve 4 and 8 bits only."
            ),
            "",
        ]
    return "\n".join(out)
