"""Several configurations of one computation timed as interleaved blocks in one process.

The host drifts: on a cloud VM, launch-bound steps move ±20-40% over seconds to minutes,
so two cells timed minutes apart (or even two blocks seconds apart) cannot tell a 10%
difference from drift. Timing both configurations in the same process, block against
block (A B, B A, A B, …), exposes both to the same drift; the ratio of each pair of
blocks cancels it, and the interval of those ratios (a paired t-interval on log times,
:func:`cs336sys.measure.stats.paired_ratio`) is what a comparison can claim. Blocks and
warm-up are those of :func:`cs336sys.measure.timing.time_steps`, the one timing harness.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from cs336sys.measure.session import Policy, Session
from cs336sys.measure.stats import Interval, paired_ratio
from cs336sys.measure.timing import MAX_TRIALS, STEP, StepClock, Timing, summarize, synchronize, timed_block, warm_up

MIN_PAIRS = 8  # interleaved pairs of a comparison, over its passes together: t(7) = 2.36, not t(1) = 12.7


def min_pairs_per_pass(policy: Policy) -> int:
    """The pairs one pass takes before it may stop: its share of :data:`MIN_PAIRS` (the merge pools every
    pass's pairs into one paired interval), and two at least, so that each pass has a ratio of its own."""
    return max(2, math.ceil(MIN_PAIRS / policy.passes))


@dataclass
class ArmsTiming:
    """Interleaved timing of several arms (configurations) in one process: see :func:`time_arms`."""

    arms: dict[str, Timing]  # per arm, as time_steps would give it (its blocks are its trials)
    blocks: dict[str, dict[str, list[float]]]  # arm -> phase -> median of each block, in pair order
    pairs: int
    stop_reason: str

    def ratio(self, a: str, b: str, phase: str = STEP) -> Interval:
        """Paired ratio time(a)/time(b) of ``phase``: :func:`cs336sys.measure.stats.paired_ratio` of the blocks."""
        return paired_ratio(self.blocks[a].get(phase, []), self.blocks[b].get(phase, []))


def time_arms(
    arms: Mapping[str, Callable[[StepClock], None]],
    session: Session,
    *,
    warmup: int,
    block_steps: int,
    device: torch.device,
    min_pairs: int | None = None,
    policy: Policy | None = None,
    warm: tuple[str, ...] = (),
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[torch.device], None] = synchronize,
) -> ArmsTiming:
    """Time several configurations of one computation as interleaved blocks: A B C, C B A, A B C, …

    Each arm is warmed up (``warmup`` steps; the first arm also until the policy's ``min_warmup_s``),
    then every round runs one block of ``block_steps`` steps of each arm, the order
    reversed every other round, so each arm runs first as often as last. Host drift
    slower than a round slows every arm of it alike and cancels in the per-round
    ratios (:meth:`ArmsTiming.ratio`): on a cloud VM whose launch-bound steps drift
    ±20-40% over seconds to minutes, this is what makes "bf16 vs fp32" answerable.
    Rounds continue past ``min_pairs`` (:func:`min_pairs_per_pass` unless given) while any arm's step
    ratio to the first arm is wider than ±``target_rel``, until this pass's share of ``max_measure_s``
    is spent in timed blocks (``policy``: the session's unless given). The first arm is the cell's own configuration. Arms named in
    ``warm`` ran just before (e.g. the cell's own block) and skip their warm-up.
    """
    session.check_not_profiled()
    names = list(arms)
    policy = policy or session.policy
    min_pairs = min_pairs_per_pass(policy) if min_pairs is None else min_pairs
    if not names or block_steps < 1 or min_pairs < 2:
        raise ValueError("time_arms needs at least one arm, block_steps >= 1 and min_pairs >= 2")
    with session.part("pairs"):
        return _interleave(arms, session, policy, warmup, block_steps, device, min_pairs, warm, clock, sync)


def _interleave(arms, session: Session, policy: Policy, warmup, block_steps, device, min_pairs, warm, clock, sync) -> ArmsTiming:
    names, state = list(arms), session.state
    min_warmup_s = session.min_warmup_s(policy)
    warmed: dict[str, tuple[int, float | None, float]] = {}
    for i, name in enumerate(names):
        t0 = clock()
        first_wait = min_warmup_s if i == 0 else 0.0
        run, first = (0, None) if name in warm else warm_up(arms[name], warmup, first_wait, device, clock, sync, session.at_clocks)
        warmed[name] = (run, first, clock() - t0)
    recorded = {f"start_{k}": v for k, v in state().items()} if state is not None else {}
    samples: dict[str, list[dict[str, list[float]]]] = {n: [] for n in names}
    timed = dict.fromkeys(names, 0.0)
    rounds, stop = 0, "fixed"
    while True:
        order = names if rounds % 2 == 0 else names[::-1]
        for name in order:
            started = clock()
            samples[name].append(timed_block(arms[name], block_steps, 0.0, device, clock, sync))
            timed[name] += clock() - started
        rounds += 1
        if rounds < min_pairs:
            continue
        if policy.target_rel <= 0 or len(names) == 1:
            break
        own = [statistics.median(b[STEP]) for b in samples[names[0]]]
        widths = [paired_ratio(own, [statistics.median(b[STEP]) for b in samples[n]]) for n in names[1:]]
        if all(w.half_width_rel <= policy.target_rel for w in widths):
            stop = "target"
            break
        if sum(timed.values()) >= policy.pass_budget_s or rounds >= MAX_TRIALS:
            stop = "budget"
            break
    session.mark_gpu_busy()
    if state is not None:
        recorded.update({f"end_{k}": v for k, v in state().items()})
    out, blocks = {}, {}
    for name in names:
        trials = samples[name]
        phases = {p: summarize([t[p] for t in trials]) for p in trials[0]}
        run, first, wall = warmed[name]
        out[name] = Timing(
            phases=phases,
            warmup_s=wall,
            timed_s=timed[name],
            warmup_steps_run=run,
            first_step_s=first,
            state=recorded,
            stop_reason=stop,
            blocks=trials,
        )
        blocks[name] = {p: [statistics.median(t[p]) for t in trials] for p in trials[0]}
    return ArmsTiming(arms=out, blocks=blocks, pairs=rounds, stop_reason=stop)
