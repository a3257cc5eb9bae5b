"""Which process group each collective of a job ran on, and each group's ranks.

A job on a device mesh runs each kind of parallelism on its own process groups (FSDP over one mesh
dimension, tensor parallelism over another): rank 0's all-gathers go to ranks {0, 2}, its all-reduces
to {0, 1}. A collective is one across its group's ranks only, so lining collectives up across the ranks
(measure/job/waits.py) needs each one's group first.

Where a collective's group comes from, best first:
- **the trace**: newer torch names it on the NCCL kernel and on `record_param_comms` ("Process Group
  Name", with "Process Group Description" and "Process Group Ranks" newer still); its ranks come from
  those, from the group's entry in the trace's `distributedInfo.pg_config` or run.json's
  `distributed.process_groups`, else from the traced ranks that ran it;
- **inferred**: a CPU backend's collective (gloo records no group) or an older trace's kernel says only
  where it ran: the backend's worker thread, or the GPU stream. Each process group has threads and streams
  of its own, so the collectives that share one on any rank run on one group: they form a *class*
  (collectives are told apart across ranks by their place in the step: collective and order, the same
  on every rank of an SPMD job). A class's ranks are then split into the groups that fit its timing: a
  collective every rank of a group finishes together ends on each of them only after all of them arrived,
  so two ranks whose instances of the class overlap that way every time ran one collective, and two ranks
  where one ends before the other arrives ran two (beyond 5 % of the collectives: clock jitter); and one
  collective ends close together on its ranks (|Δ end| at most twice the shorter one's time in it). The
  splits tried are the groups the traces and run.json list (a mesh dimension's groups share a
  description, `mesh_dp`): the coarsest whose pairs all end close together, else (a noisy run) the one
  whose pairs end closest. Without a list, the whole class is one group when its pairs all end close
  together; else ranks are joined pair by pair (the closest ends first) while no pair of a group breaks
  the rule, and a split is kept only when all of its groups have two ranks or more. Where the collectives
say their group's size (an NCCL kernel's "Group size"; a gloo all-gather's or reduce-scatter's c10d call,
whose output holds every rank's input), only groups of that size are tried; when joining the closest
  pairs first strands a rank, the splits into groups of that size where no pair breaks the rule are
  scored instead, the closest ends first (a real 2 × 2 gloo job's FSDP ranks were once taken for one group
  of four this way). The inference assumes the ranks' clocks agree (one host, or synchronised hosts), and
  says when it was made.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from gpuadvise.analyzer.model.collectives import SYMMETRIC, parse_ranks

SLACK_US = 50.0  # how far one rank's "ended" may precede another's "arrived" on clocks that agree
MAX_MISFITS = 0.05  # the share of a pair's collectives that may break that (clock jitter)
MAX_END_RATIO = 2.0  # ends "close together": |Δ end| at most this many times the shorter collective
SPLITS_SCORED = 16  # splits into groups of a recorded size scored by their ends when joining pairs strands a rank


@dataclass
class Group:
    """One process group of the job."""

    id: str  # "pg 1" where its name is known, else "ranks 0,2"
    ranks: list[int]  # all its ranks where the trace or run.json says, else the traced ranks that ran it
    traced: list[int]  # its ranks that were traced
    name: str = ""  # the process group's name ("" when not known)
    desc: str = ""  # its description ("mesh_dp", "default_pg"; "" when not known)
    source: str = "trace"  # "trace", "run.json", "inferred" (from the collectives' timing) or "unnamed"

    @property
    def dim(self) -> str:
        """The mesh dimension it spans ("dp" for `mesh_dp`), "" when its description does not say."""
        return self.desc[len("mesh_"):] if self.desc.startswith("mesh_") else ""


@dataclass
class Resolved:
    """Per rank (by position), each collective's group id; the groups; notes for the report."""

    rows: list[list[str] | None]
    groups: dict[str, Group] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def members(self, gid: str) -> list[int]:
        """Positions of the ranks that ran collectives of group `gid`."""
        return [i for i, rows in enumerate(self.rows) if rows is not None and gid in rows]

    def shown(self, gid: str, ranks: int) -> str:
        """How a matched collective's group is shown beside it: its name where the trace gave one, "" for
        one group of every traced rank whose name no trace says, else its ranks."""
        g = self.groups.get(gid)
        if g is None:
            return ""
        if g.name:
            return g.name
        return "" if len(g.traced) == ranks else ",".join(map(str, g.ranks))


def resolve(collectives: list, rank_ids: list[int], known: list[list[dict]] | None = None) -> Resolved:
    """`collectives`: one measure.job.collectives.RankCollectives (or None) per rank, in rank order;
    `rank_ids`: their ranks; `known`: per rank, the process groups its trace header and run.json list
    ({"name", "desc", "ranks"})."""
    named = _known_groups(known or [])
    out = Resolved(rows=[None if c is None else [""] * len(c) for c in collectives])
    # 1. groups the trace names
    for i, c in enumerate(collectives):
        if c is None:
            continue
        for j, pg in enumerate(c.pg):
            if pg:
                gid = f"pg {pg}"
                out.rows[i][j] = gid
                if gid not in out.groups:
                    ranks = named[pg]["ranks"] if pg in named else parse_ranks(c.pg_ranks[j] if c.pg_ranks else "")
                    desc = (c.pg_desc[j] if c.pg_desc else "") or named.get(pg, {}).get("desc", "")
                    out.groups[gid] = Group(gid, ranks, [], name=pg, desc=desc,
                                            source="trace" if pg not in named else named[pg]["source"])
    # 2. the rest, by class
    classes = _classes(collectives)
    inferred = ambiguous = False
    options = {cls: _partition(collectives, where, rank_ids, named) for cls, where in classes.items()}
    taken: list = []
    # classes whose timing names one split first; a class that fits several equally takes one no other
    # class took (each process group has threads and streams of its own)
    for cls in sorted(options, key=lambda c: len(options[c])):
        where, choices = classes[cls], options[cls]
        partition, how = next(((p, h) for p, h in choices if p not in taken), choices[0])
        taken.append(partition)
        inferred |= how in ("inferred", "timed")
        ambiguous |= len(choices) > 1
        for block in partition:
            traced_ranks = [rank_ids[i] for i in block]
            group = _group_of(traced_ranks, named, set(rank_ids), how)
            out.groups.setdefault(group.id, group)
            for i in block:
                for j in where[i]:
                    out.rows[i][j] = group.id
    for gid, g in out.groups.items():
        g.traced = [rank_ids[i] for i in out.members(gid)]
        if not g.ranks:
            g.ranks = list(g.traced)
    if inferred:
        out.notes.append("the process group of each collective the traces do not name (a CPU backend's, or an older "
                         "torch's) was inferred from which ranks' collectives end together")
    if ambiguous:
        out.notes.append("for some of the collectives the traces do not name a group for, the timing fits more than "
                         "one split of the ranks into groups (ranks in lockstep): their groups are a guess")
    return out


def _known_groups(known: list[list[dict]]) -> dict[str, dict]:
    """Every process group the ranks list, by name: its description, ranks and where it was read."""
    out: dict[str, dict] = {}
    for groups in known:
        for g in groups or []:
            name, ranks = str(g.get("name", "")), parse_ranks(g.get("ranks"))
            if name and ranks and name not in out:
                out[name] = {"desc": str(g.get("desc") or ""), "ranks": ranks, "source": g.get("source", "trace")}
    return out


def _classes(collectives: list) -> dict[int, dict[int, list[int]]]:
    """The collectives no trace names a group for, joined into classes that run on one group: by their
    place in the step (same collective and order), joined wherever two places share a thread or stream
    on some rank. Returns class → rank position → row indices."""
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra

    places: list = []
    for i, c in enumerate(collectives):
        rows = []
        if c is not None:
            by_lane: dict = defaultdict(list)
            for j in range(len(c)):
                if c.pg[j]:
                    continue
                place = (c.step[j] >= 0, c.kind[j], int(c.order[j]))
                find(place)
                by_lane[c.lane[j] if c.lane else ""].append(place)
                rows.append((j, place))
            for lane_places in by_lane.values():
                for p in lane_places[1:]:
                    union(lane_places[0], p)
        places.append(rows)
    out: dict = defaultdict(lambda: defaultdict(list))
    roots: dict = {}
    for i, rows in enumerate(places):
        for j, place in rows:
            root = find(place)
            out[roots.setdefault(root, len(roots))][i].append(j)
    return {k: dict(v) for k, v in out.items()}


def _pair_fit(collectives: list, where: dict, a: int, b: int) -> tuple[float, float, int]:
    """Ranks (positions) a and b on one class: the share of their common collectives that could not be
    one collective (one ended before the other arrived, beyond the slack), and the median |Δ end| over
    the shorter of the two, with the number compared."""
    ca, cb = collectives[a], collectives[b]
    ka = {(int(ca.step[j]), ca.kind[j], int(ca.order[j])): j for j in where[a]}
    kb = {(int(cb.step[j]), cb.kind[j], int(cb.order[j])): j for j in where[b]}
    common = [k for k in ka if k in kb]
    if not common:
        return 1.0, np.inf, 0
    ja, jb = np.array([ka[k] for k in common]), np.array([kb[k] for k in common])
    sa, ea, sb, eb = ca.start_us[ja], ca.end_us[ja], cb.start_us[jb], cb.end_us[jb]
    together = np.array([ca.kind[j] in SYMMETRIC for j in ja], dtype=bool)
    misfit = together & (np.minimum(ea, eb) < np.maximum(sa, sb) - SLACK_US)
    ratio = np.abs(ea - eb) / np.maximum(np.minimum(ea - sa, eb - sb), 1.0)
    return float(misfit.mean()), float(np.median(ratio)), len(common)


def _partition(collectives: list, where: dict, rank_ids: list[int], named: dict) -> list[tuple[list[list[int]], str]]:
    """The ranks (positions) of one class split into groups, and how: "run.json"/"trace" (the one split the
    listed groups give), "timed" (one of several listed splits, chosen by the timing), "inferred" (from the
    timing alone), "one" (every rank of the class, nothing says otherwise). More
    than one when listed splits fit equally well (ranks in lockstep: the timing cannot tell them apart)."""
    members = sorted(where)
    if len(members) < 2:
        return [([members], "one")]
    cache: dict = {}

    def fit(a, b):
        key = (min(a, b), max(a, b))
        if key not in cache:
            cache[key] = _pair_fit(collectives, where, *key)
        return cache[key]

    def fits(partition) -> tuple[bool, float, float]:
        """Whether no pair of a group breaks the ends rule, and the mean and worst |Δ end| ratio."""
        ratios = []
        for block in partition:
            for x, y in combinations(block, 2):
                misfits, ratio, n = fit(x, y)
                if n == 0 or misfits > MAX_MISFITS:
                    return False, np.inf, np.inf
                ratios.append(ratio)
        return True, float(np.mean(ratios)) if ratios else np.inf, max(ratios, default=np.inf)

    whole = [members]
    size = _group_size(collectives, where)
    candidates = _listed_splits(members, rank_ids, named, size)
    if candidates:
        scored = []
        for split, source in candidates:
            ok, mean, worst = fits(split)
            if ok:
                scored.append((len(split), mean, worst, split, source))
        # the coarsest split whose every pair ends close together; else (a noisy run) the closest ends
        close = [s for s in scored if s[2] <= MAX_END_RATIO]
        pool = sorted(close, key=lambda s: (s[0], s[1])) if close else sorted(scored, key=lambda s: (s[1], s[0]))
        if pool:
            blocks, ratio = pool[0][0], pool[0][1]
            how = lambda source: "timed" if len(candidates) > 1 else source  # noqa: E731 - chosen among listed ones
            return [(split, how(source)) for n, r, _, split, source in pool
                    if n == blocks and r <= max(1.1 * ratio, ratio + 0.05)]
    ok, _, worst = fits(whole)
    if ok and worst <= MAX_END_RATIO and (size is None or len(members) <= size):
        return [(whole, "one")]
    split = _joined(members, fit, size)
    if split and all(len(b) >= 2 for b in split) and len(split) > 1:
        others = [s for s in _splits(members, fit, len(split[0])) if s != split] if \
            len({len(b) for b in split}) == 1 else []
        return [(split, "inferred")] + [(s, "inferred") for s in others[:1]]
    if size is not None and len(members) > size:
        # joining the closest pairs first can strand a rank (its partner went to a pair that ends closer):
        # the splits into groups of the recorded size where no pair breaks the ends rule, the closest ends first
        scored = sorted((fits(s)[1], s) for s in _splits(members, fit, size, limit=SPLITS_SCORED))
        if scored:
            best = scored[0][0]
            return [(s, "inferred") for r, s in scored if r <= max(1.1 * best, best + 0.05)]
    return [(whole, "one")]


def _splits(members: list[int], fit, size: int, limit: int = 2) -> list[list[list[int]]]:
    """Up to `limit` splits of `members` into groups of `size` where no pair breaks the ends rule (two: the
    timing cannot tell them apart)."""
    def ok(a, b) -> bool:
        misfits, _, n = fit(a, b)
        return n > 0 and misfits <= MAX_MISFITS

    out: list = []

    def grow(left: list[int], blocks: list[list[int]]) -> None:
        if len(out) >= limit:
            return
        if not left:
            out.append(sorted(sorted(b) for b in blocks))
            return
        head, rest = left[0], left[1:]
        for partners in combinations([x for x in rest if ok(head, x)], size - 1):
            if all(ok(x, y) for x, y in combinations(partners, 2)):
                grow([x for x in rest if x not in partners], blocks + [[head, *partners]])

    if size >= 2 and len(members) % size == 0:
        grow(list(members), [])
    return out


def _group_size(collectives: list, where: dict) -> int | None:
    """The size of the group a class runs on, where its collectives record it ("Group size", or for a CPU
    backend's the tensors of the c10d call that issued it: measure/job/collectives.py): the most common one;
    None when none does."""
    sizes = Counter()
    for i, rows in where.items():
        c = collectives[i]
        if len(c.group_size):
            sizes.update(int(x) for x in c.group_size[rows] if x > 0)
    return sizes.most_common(1)[0][0] if sizes else None


def _listed_splits(members: list[int], rank_ids: list[int], named: dict,
                   size: int | None = None) -> list[tuple[list[list[int]], str]]:
    """The splits of `members` (positions) the listed groups give: per description (a mesh dimension's
    groups share one), the groups restricted to these ranks, when they cover them with two or more each
    (and, where the collectives record their group's size, groups of that size only)."""
    pos = {r: i for i, r in enumerate(rank_ids)}
    by_desc: dict = defaultdict(list)
    for name, g in named.items():
        if size is None or len(g["ranks"]) == size:
            by_desc[g["desc"] or f"group {name}"].append(g)
    out = []
    mine = set(members)
    for desc, groups in by_desc.items():
        blocks = []
        for g in groups:
            block = sorted(pos[r] for r in g["ranks"] if r in pos and pos[r] in mine)
            if len(block) >= 2 and block not in blocks:
                blocks.append(block)
        covered = [i for b in blocks for i in b]
        if blocks and len(covered) == len(set(covered)) and set(covered) == mine:
            out.append((blocks, groups[0]["source"]))
    return out


def _joined(members: list[int], fit, size: int | None = None) -> list[list[int]]:
    """Ranks joined pair by pair, the closest ends first, while no pair of a group breaks the ends rule (and
    the group stays within the size its collectives record)."""
    pairs = []
    for x, y in combinations(members, 2):
        misfits, ratio, n = fit(x, y)
        if n and misfits <= MAX_MISFITS:
            pairs.append((ratio, x, y))
    block = {m: [m] for m in members}
    for _, a, b in sorted(pairs):
        ba, bb = block[a], block[b]
        if ba is bb:
            continue
        if (size is None or len(ba) + len(bb) <= size) and \
                all(any(p[1:] in ((u, v), (v, u)) for p in pairs) for u in ba for v in bb):
            merged = sorted(ba + bb)
            for m in merged:
                block[m] = merged
    out = []
    for b in block.values():
        if b not in out:
            out.append(b)
    return out


def _group_of(traced: list[int], named: dict, all_traced: set, how: str) -> Group:
    """The group of these traced ranks: the listed group that holds exactly these of the traced ranks (the
    smallest, where several do), else one named by its ranks."""
    want = set(traced)
    fitting = [(len(g["ranks"]), name, g) for name, g in named.items() if set(g["ranks"]) & all_traced == want]
    if fitting:
        _, name, g = min(fitting, key=lambda x: (x[0], x[1]))
        return Group(f"pg {name}", list(g["ranks"]), [], name=name, desc=g["desc"], source=g["source"])
    return Group(f"ranks {','.join(map(str, sorted(traced)))}", sorted(traced), [],
                 source="inferred" if how in ("inferred", "timed") else "unnamed")


def groups_of_rank(meta_groups: list[dict], facts_groups: list[dict]) -> list[dict]:
    """The process groups one rank lists (its trace header's, then run.json's), each with where it was read."""
    out = [{**g, "source": "trace"} for g in meta_groups or []]
    names = {g["name"] for g in out}
    out += [{**g, "source": "run.json"} for g in facts_groups or [] if str(g.get("name")) not in names]
    return out


def scheme_of(schemes: list[str]) -> str:
    """The scheme that issued a group's collectives ("fsdp", "tp", …): "" when none says, or when they
    came from two or more (DDP's all-reduces beside an embedding all-to-all on one group)."""
    found = {s for s in schemes if s}
    return found.pop() if len(found) == 1 else ""
