"""A job's communication by process group and phase: for each group (measure/job/commgroups.py) and each
place its collectives were issued from (measure/job/commphases.py: "FSDP all-gather in forward",
"tensor parallel all-reduce in backward"), per member rank and step:

- inside: the time the rank spent inside them (their union on its clock, from its arrival to its end);
- exposed: the part of that with nothing of its own beside it (measure/job/collectives.own_work);
- wait: the exposed part of its wait for the group's last rank to arrive; transfer: the exposed part of
  the rest (measure/job/waits.py).

Each figure is the median over the steps every rank recorded, per rank; a row shows the median over the
group's ranks, and the JSON each rank's. The mesh, where the groups say it (a device mesh names its
groups `mesh_<dim>`, and run.json records the mesh `init_device_mesh` built), is its dimensions and the
ranks of each group along each.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from . import waits
from .commgroups import Resolved, scheme_of
from .commphases import SCHEMES, label, where


def by_group(m: waits.Matched, resolved: Resolved, rank_ids: list[int], steps: list[int]) -> list[dict]:
    """One entry per kind of process group (a mesh dimension's groups, which share a description; else
    the groups that run one kind of parallelism, of one size) with collectives lined up, the most exposed
    first: its groups, its figures over all their ranks and its phases (most exposed first)."""
    if m is None or not len(m) or not steps:
        return []
    by_gid: dict = defaultdict(list)
    for k, gid in enumerate(m.group or [""] * len(m)):
        by_gid[gid].append(k)
    families: dict = defaultdict(list)
    for gid, cols in by_gid.items():
        g = resolved.groups.get(gid) if resolved is not None else None
        scheme = scheme_of([m.scheme[k] for k in cols] if m.scheme else [])
        desc = g.desc if g is not None and g.desc not in ("", "undefined") else ""
        role = SCHEMES.get(scheme, scheme)
        family = desc or (f"{role} groups" if role else f"groups of {len(g.ranks) if g else 0} ranks")
        families[family].append((gid, g, cols))
    out = []
    for family, members_of in families.items():
        cols = np.array(sorted(k for _, _, c in members_of for k in c), dtype=np.int64)
        members = _members(m, cols, len(rank_ids))
        phases = defaultdict(list)
        for k in cols.tolist():
            phases[(m.scheme[k] if m.scheme else "", m.kind[k], m.phase[k] if m.phase else "")].append(k)
        rows = [{"scheme": scheme, "collective": kind, "phase": phase, "label": label(scheme, kind, phase),
                 "where": where(kind, phase),
                 **_figures(m, np.array(pcols, dtype=np.int64), _members(m, pcols, len(rank_ids)), rank_ids, steps)}
                for (scheme, kind, phase), pcols in phases.items()]
        rows.sort(key=lambda r: -r["exposed_ms"])
        scheme = scheme_of([m.scheme[k] for k in cols.tolist()] if m.scheme else [])
        groups = []
        for gid, g, gcols in sorted(members_of, key=lambda x: (x[1].ranks if x[1] else [], x[0])):
            gmembers = _members(m, gcols, len(rank_ids))
            exposed = _figures(m, np.array(gcols, dtype=np.int64), gmembers, rank_ids, steps)["exposed_ms"]
            groups.append({"group": gid, "name": g.name if g else "", "ranks": list(g.ranks) if g else
                           [rank_ids[i] for i in gmembers], "traced": [rank_ids[i] for i in gmembers],
                           "source": g.source if g else "unnamed", "exposed_ms": exposed})
        first = members_of[0][1]
        desc, role = (first.desc if first else ""), SCHEMES.get(scheme, scheme)
        out.append({"family": family, "shown": f"{family} ({role})" if desc and role else family, "desc": desc,
                    "dim": first.dim if first else "", "scheme": scheme, "role": role, "groups": groups,
                    **_figures(m, cols, members, rank_ids, steps), "phases": rows})
    out.sort(key=lambda g: -g["exposed_ms"])
    return out


def _members(m: waits.Matched, cols, ranks: int) -> list[int]:
    """Positions of the ranks that ran any of `cols`."""
    cols = np.asarray(cols, dtype=np.int64)
    return [i for i in range(ranks) if m.member is None or m.member[i, cols].any()]


def _figures(m: waits.Matched, cols: np.ndarray, members: list[int], rank_ids: list[int], steps: list[int]) -> dict:
    """The collectives `cols` per step and rank: count, inside, exposed, exposed wait and transfer."""
    parts = {name: waits.exposed_per_step(m, steps, part, cols, less_own_work=less)
             for name, part, less in (("inside", "inside", False), ("exposed", "inside", True),
                                      ("wait", "wait", True), ("transfer", "transfer", True))}
    per_rank = []
    for i in members:
        per_rank.append({"rank": rank_ids[i], **{f"{k}_ms": _ms(np.median(v[i])) for k, v in parts.items()}})
    rows = {k: np.array([np.median(v[i]) for i in members]) for k, v in parts.items()}
    counts = np.array([[np.sum(m.step[m.on(i, cols)] == s) for s in steps] for i in members], dtype=float)
    exposed_steps = np.median(parts["exposed"][members], axis=0) if members else np.zeros(len(steps))
    return {"per_step": round(float(np.median(counts)), 1),
            **{f"{k}_ms": _ms(np.median(v)) if len(v) else 0.0 for k, v in rows.items()},
            "exposed_ms_per_step": [_ms(x) for x in exposed_steps], "per_rank": per_rank}


def mesh(resolved: Resolved | None, facts_meshes: list[dict]) -> dict | None:
    """The job's device mesh: from run.json where `init_device_mesh` was recorded (its shape, dimension
    names and layout), else from the groups named `mesh_<dim>`: per dimension, its groups' ranks."""
    for fm in facts_meshes or []:
        shape, names = fm.get("shape"), fm.get("dim_names")
        if isinstance(shape, list) and shape:
            named = isinstance(names, list) and len(names) == len(shape)
            dims = names if named else [f"dim{i}" for i in range(len(shape))]
            return {"shape": shape, "dims": dims, "groups": _layout_groups(fm.get("mesh"), dims), "source": "run.json"}
    if resolved is None:
        return None
    dims: dict = defaultdict(list)
    for g in resolved.groups.values():
        if g.dim and sorted(g.ranks) not in dims[g.dim]:
            dims[g.dim].append(sorted(g.ranks))
    if not dims:
        return None
    return {"shape": [len(v[0]) for v in dims.values()], "dims": list(dims),
            "groups": {d: sorted(v) for d, v in dims.items()}, "source": "trace"}


def _layout_groups(layout, dims: list[str]) -> dict:
    """The groups along each dimension of a mesh's rank layout (a nested list): dimension → ranks lists."""
    try:
        a = np.array(layout, dtype=np.int64)
    except (TypeError, ValueError):
        return {}
    if a.ndim != len(dims):
        return {}
    out = {}
    for d, name in enumerate(dims):
        moved = np.moveaxis(a, d, -1).reshape(-1, a.shape[d])
        out[name] = sorted(sorted(row.tolist()) for row in moved)
    return out


def _ms(us) -> float:
    return round(float(us) / 1e3, 3)
