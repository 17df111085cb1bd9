"""The precision_search stage: model + text -> a mixed-precision ``recipe`` artifact that calibrate takes.

    run_precision_search(cfg, model_uri=..., data_uri=None, output_uri=...) -> metrics

1. three fixed token batches: the *search* batch (every reward is measured
   on it), the *selection* batch (the next windows of the same text: the
   search's top recipes are re-measured there) and a *held-out* batch (only
   for the final comparison table); from the data_prep artifact's train and
   eval splits, or ``data.path``;
2. decision units (``granularity``) and every (linear, format) weight,
   quantized once (``quarl.search.measure``); the budget (``budget_bits``, or
   uniform ``budget_format``'s bits on this model);
3. the single-unit sensitivity table (each unit alone in each format): the
   greedy baseline's ranking, the shaped per-step reward and part of the
   agent's observation;
4. baselines: uniform recipes, greedy at the budget, random search with as
   many episodes as the agent;
5. PPO (``quarl.search.ppo``) on :class:`~quarl.search.env.PrecisionEnv`,
   checkpointed every update under ``checkpoint_dir`` (resumed when present);
6. selection: the ``select_top`` best distinct episodes of the agent (and of
   random search) re-measured on the selection batch; the best there is the
   searched recipe (the search batch's very best is partly its noise);
7. every recipe measured again on the held-out batch; the artifact holds
   ``recipe.yaml`` (a quarl.quant recipe: ``calibrate --recipe`` / the
   ``recipe`` input), ``search.json`` (everything measured), ``report.md``,
   ``reward_curve.png`` and ``formats.png``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import torch
import yaml

from quarl.calibrate.data import make_windows, read_artifact_split, read_text_file, shuffled
from quarl.config import config_to_dict
from quarl.quant.spec import make_config, spec_string
from quarl.search import baselines
from quarl.search.config import PrecisionSearchConfig
from quarl.search.env import PrecisionEnv, sensitivity_table
from quarl.search.measure import ModelEvaluator, build_units, to_recipe
from quarl.search.ppo import PPO
from quarl.search.report import comparison_markdown, plot_formats, plot_rewards
from quarl.search.reward import reward

log = logging.getLogger(__name__)
STAGE = "precision_search"


def _batches(cfg: PrecisionSearchConfig, tok, data_uri: str | None):
    """(search ids, selection ids or None, held-out ids or None, provenance): disjoint token windows."""
    d = cfg.data
    if data_uri:
        from quarl.artifacts import open_artifact

        root = open_artifact(data_uri, kind="dataset").path
        train = shuffled(read_artifact_split(root, "train", d.columns), d.seed)
        try:
            held_docs = shuffled(read_artifact_split(root, "eval", d.columns), d.seed)
        except Exception:  # noqa: BLE001 - no eval split: hold out the tail of train instead
            held_docs = None
        src = f"{data_uri} [train / eval] columns={d.columns}"
    elif d.path:
        train, held_docs, src = shuffled(read_text_file(d.path, d.text_field), d.seed), None, d.path
    else:
        raise ValueError("precision_search needs text: connect a data_prep artifact (data_uri) or set data.path")
    if held_docs is None:
        k = max(1, len(train) // 5)
        train, held_docs = train[:-k], train[-k:]
    # search and selection windows: consecutive windows of the same train stream, so they never overlap
    both = make_windows(train, tok, d.num_samples + d.select_samples, d.seq_len)
    search_ids = both[: d.num_samples]
    select = both[d.num_samples:] if d.select_samples and len(both) > d.num_samples else None
    if d.select_samples and select is None:
        log.warning("precision_search: no train text left for the selection batch; keeping the best search episode")
    held = make_windows(held_docs, tok, d.heldout_samples, d.seq_len) if d.heldout_samples else None
    return search_ids, select, held, src


def _checkpoint_path(cfg: PrecisionSearchConfig, model_uri: str, search_ids: torch.Tensor) -> Path:
    if cfg.checkpoint_dir:
        return Path(cfg.checkpoint_dir) / "ppo.pt"
    from quarl.artifacts import cache_root

    key = json.dumps([config_to_dict(cfg), model_uri, search_ids.tolist()], sort_keys=True, default=str)
    return cache_root() / "precision_search" / hashlib.sha256(key.encode()).hexdigest()[:16] / "ppo.pt"


def _top(returns: list[float], actions: list[tuple], k: int) -> list[tuple]:
    """The ``k`` best distinct assignments by return, best first."""
    best: dict[tuple, float] = {}
    for r, a in zip(returns, actions, strict=True):
        best[tuple(a)] = max(r, best.get(tuple(a), float("-inf")))
    return sorted(best, key=lambda a: -best[a])[:k]


def select(ev, ids: torch.Tensor | None, candidates: list[tuple], w) -> tuple[tuple, list[dict]]:
    """The candidate with the best reward on the selection batch ``ids`` (the first candidate without one)."""
    if ids is None or len(candidates) == 1:
        return candidates[0], []
    ref = ev.reference_on(ids)
    scored = [{"assignment": list(a), "reward": reward(ev.measure_on(ids, a), ref, w)} for a in candidates]
    i = max(range(len(scored)), key=lambda j: scored[j]["reward"])
    return candidates[i], scored


def search(cfg: PrecisionSearchConfig, model, tok, search_ids: torch.Tensor, held_ids: torch.Tensor | None,
           checkpoint: Path | None, progress: bool = True, select_ids: torch.Tensor | None = None) -> dict:
    """Everything but the artifact: baselines, PPO, selection, held-out comparison. Returns a JSON-able dict."""
    t0 = time.perf_counter()
    units = build_units(model, cfg.exclude, cfg.granularity)
    ev = ModelEvaluator(model, units, cfg.formats, search_ids, method=cfg.method,
                        measure_entropy=cfg.measure_entropy, recovery_steps=cfg.recovery_steps,
                        recovery_lr=cfg.recovery_lr, progress=progress)
    t_quant = time.perf_counter() - t0
    budget = cfg.budget_bits
    if budget is None and cfg.budget_format is not None:  # uniform <budget_format>'s bits on this very model
        spec = spec_string(make_config(cfg.budget_format))
        budget = ev.avg_bits((next(i for i, f in enumerate(cfg.formats) if spec_string(make_config(f)) == spec),)
                             * len(units))
    sens = sensitivity_table(ev, cfg.formats, progress=progress) if cfg.sensitivity else None
    n_sens = ev.evaluations
    env = PrecisionEnv(ev, cfg.formats, cfg.reward, budget, sensitivity=sens)
    t_setup = time.perf_counter() - t0
    rows: dict[str, dict] = {}
    k = cfg.select_top if select_ids is not None else 1

    def row(name: str, assignment, evaluations=None, **extra) -> None:
        m = ev.measure(assignment)
        rows[name] = {"name": name, "assignment": list(assignment), "avg_bits": m.avg_bits, "loss": m.loss,
                      "kl": m.kl, "kl_ref_quant": m.kl_ref_quant, "entropy": m.entropy,
                      "reward": reward(m, ev.ref, cfg.reward), "evaluations": evaluations, **extra}

    if "uniform" in cfg.baselines:
        for f, spec in enumerate(cfg.formats):
            if ev.configs[f] is not None:
                row(f"uniform {spec}", baselines.uniform(len(units), f), 1)
    t1 = time.perf_counter()
    if "greedy" in cfg.baselines:
        cost = [[-e for e in r] for r in env.est]
        row("greedy (sensitivity)", baselines.greedy(ev.bits, ev.params, cost, budget), f"{n_sens} sens. + 1")
    t_greedy = time.perf_counter() - t1
    t1 = time.perf_counter()
    rand, rand_scored = None, []
    if "random" in cfg.baselines:
        rand = baselines.random_search(env, cfg.ppo.episodes, seed=cfg.seed + 1, progress=progress)
        chosen, rand_scored = select(ev, select_ids, _top(rand["returns"], rand["assignments"], k), cfg.reward)
        if rand_scored:
            row("random search (selected)", chosen, f"{cfg.ppo.episodes} + {len(rand_scored)} sel.")
        row("random search (best)", rand["assignment"], cfg.ppo.episodes)
    t_random = time.perf_counter() - t1
    t1 = time.perf_counter()
    agent = PPO(env.obs_dim(), len(cfg.formats), cfg.ppo, seed=cfg.seed, action_dim=env.action_feature_dim())
    res = agent.train(env, checkpoint=checkpoint, progress=progress)
    t_ppo = time.perf_counter() - t1
    greedy_traj, _ = agent.run_episode(env, greedy=True)
    sens_n = f"{n_sens} sens. + " if sens is not None else ""  # the agent's shaping and observation use the table
    cands = _top(res.episode_returns, res.episode_actions, k)
    best, ppo_scored = select(ev, select_ids, cands, cfg.reward)
    if ppo_scored:
        row("PPO (selected)", best, f"{sens_n}{cfg.ppo.episodes} + {len(ppo_scored)} sel.")
    row("PPO (best episode)", res.best_actions, f"{sens_n}{cfg.ppo.episodes}")
    row("PPO policy (argmax)", tuple(greedy_traj["act"]), f"{sens_n}{cfg.ppo.episodes} + 1")
    searched = "PPO (selected)" if ppo_scored else "PPO (best episode)"
    if held_ids is not None:
        ref_h = ev.reference_on(held_ids)
        for r in rows.values():
            m = ev.measure_on(held_ids, r["assignment"])
            r["heldout"] = {"loss": m.loss, "kl": m.kl, "kl_ref_quant": m.kl_ref_quant, "entropy": m.entropy,
                            "reward": reward(m, ref_h, cfg.reward)}
    ev.restore()
    recipe = to_recipe(units, cfg.formats, best, cfg.exclude, model=model)
    return {
        "recipe": recipe,
        "searched": searched,
        "assignment": {u.name: cfg.formats[a] for u, a in zip(units, best, strict=True)},
        "units": [{"name": u.name, "pattern": u.pattern, "kind": u.kind, "params": u.params} for u in units],
        "formats": cfg.formats,
        "granularity": cfg.granularity,
        "bits": ev.bits,
        "reference": {"loss": ev.ref.loss, "entropy": ev.ref.entropy},
        "sensitivity_kl": [[m.kl for m in r] for r in sens] if sens else None,
        "sensitivity_kl_ref_quant": [[m.kl_ref_quant for m in r] for r in sens] if sens else None,
        "comparison": list(rows.values()),
        "selection": {"top": k, "ppo": ppo_scored, "random": rand_scored},
        "ppo": {"episode_returns": res.episode_returns, "best_return": res.best_return, "updates": res.updates},
        "random": {"episode_returns": rand["returns"]} if rand else None,
        "budget_bits": budget,
        "budget_format": cfg.budget_format if cfg.budget_bits is None else None,
        "search_batch": list(search_ids.shape),
        "select_batch": list(select_ids.shape) if select_ids is not None else None,
        "heldout_batch": list(held_ids.shape) if held_ids is not None else None,
        "evaluations": {"unique": ev.evaluations, "sensitivity": n_sens,
                        "forward_equivalents": ev.block_runs / len(ev.blocks)},
        "seconds": {"quantize": t_quant, "setup": t_setup, "greedy": t_greedy, "random": t_random, "ppo": t_ppo,
                    "total": time.perf_counter() - t0},
    }


def _report(out: dict, model_uri: str) -> str:
    s = out["seconds"]
    lines = [
        f"# Precision search: {model_uri}",
        "",
        (f"- formats: {', '.join(out['formats'])}; budget: {out['budget_bits']} average bits; "
        f"{len(out['units'])} units ({out['granularity']} granularity)"),
        (f"- search batch {out['search_batch']} tokens, selection batch {out['select_batch']}, held-out batch "
         f"{out['heldout_batch']}"),
        (f"- PPO: {len(out['ppo']['episode_returns'])} episodes, best R = {out['ppo']['best_return']:.4f}; "
        f"wall time {s['total']:.0f} s (setup {s['setup']:.0f}, random {s['random']:.0f}, PPO {s['ppo']:.0f})"),
        f"- searched recipe: {out['searched']}",
        (f"- evaluations: {out['evaluations']['unique']} unique recipes, "
        f"{out['evaluations']['forward_equivalents']:.0f} forward-pass equivalents"),
        "",
        "## Comparison",
        "",
        comparison_markdown(out["comparison"]),
        "![reward curve](reward_curve.png)",
        "",
        "![formats](formats.png)",
        "",
        "## Searched recipe",
        "",
        "```yaml",
        yaml.safe_dump(out["recipe"], sort_keys=False).strip(),
        "```",
    ]
    return "\n".join(lines) + "\n"


def run_precision_search(cfg: PrecisionSearchConfig, *, model_uri: str, data_uri: str | None = None,
                         output_uri: str, overwrite: bool = False, progress: bool = True) -> dict:
    """Search a per-unit format recipe for ``model_uri``; write a ``recipe`` artifact to ``output_uri``."""
    from quarl.artifacts import write_artifact
    from quarl.models import load_model

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    model, tok = load_model(model_uri, dtype=torch.float32, device=device)
    search_ids, select_ids, held_ids, src = _batches(cfg, tok, data_uri)
    search_ids = search_ids.to(device)
    select_ids = select_ids.to(device) if select_ids is not None else None
    held_ids = held_ids.to(device) if held_ids is not None else None
    ckpt = _checkpoint_path(cfg, model_uri, search_ids)
    if not cfg.resume and ckpt.is_file():
        ckpt.unlink()  # start over: the agent would otherwise continue from it
    resumed = str(ckpt) if ckpt.is_file() else None
    if resumed:  # loud: a finished search in the cache returns its agent without a new episode
        log.warning("precision_search: continuing the PPO checkpoint %s (same config, model and search batch); "
                    "set resume=false to search from scratch", ckpt)
    inputs = [u for u in (model_uri, data_uri) if u]
    with write_artifact(output_uri, "recipe", STAGE, config=cfg, inputs=inputs, overwrite=overwrite) as art:
        out = search(cfg, model, tok, search_ids, held_ids, ckpt, progress=progress, select_ids=select_ids)
        out["data"] = src
        out["resumed_from"] = resumed
        p = art.path
        (p / "recipe.yaml").write_text(yaml.safe_dump(out["recipe"], sort_keys=False))
        (p / "search.json").write_text(json.dumps(out, indent=1, default=str))
        refs = {r["name"]: r["reward"] for r in out["comparison"] if r["name"].startswith(("uniform", "greedy"))}
        rand = out["random"]["episode_returns"] if out["random"] else None
        plot_rewards(p / "reward_curve.png", out["ppo"]["episode_returns"], rand, refs)
        plot_formats(p / "formats.png", [u["name"] for u in out["units"]], out["formats"],
                     {r["name"]: tuple(r["assignment"]) for r in out["comparison"]})
        (p / "report.md").write_text(_report(out, model_uri))
        best = next(r for r in out["comparison"] if r["name"] == out["searched"])
        art.metadata["metrics"] = {k: best[k] for k in ("avg_bits", "kl", "loss", "reward")}
    log.info("precision_search: %s -> %s (avg %.3f bits, KL %.4f)", model_uri, output_uri, best["avg_bits"],
             best["kl"])
    return {
        "stage": STAGE,
        "searched": {k: best[k] for k in ("avg_bits", "kl", "loss", "reward", "entropy")},
        "comparison": {r["name"]: {k: r[k] for k in ("avg_bits", "kl", "loss", "reward")} for r in out["comparison"]},
        "seconds": out["seconds"],
        "evaluations": out["evaluations"],
        "recipe": out["recipe"],
    }
