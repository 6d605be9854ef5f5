"""Prove each exercise's check by the mutants of its solution: every one killed, or shown equivalent.

    python scripts/mutants.py [EXERCISE_ID ...] [--sample N] [--workers 2] [--json FILE]
                                                           (make mutants; make mutants EX=04_row_softmax)

For each exercise (all by default), every mutant of ``attention_lib.checks.mutation``'s catalogue is
checked like a student's answer, on the simulator, in worker processes. A mutant the check refuses
is killed; one it passes survives, and is either listed in tests/equivalent_mutants/NN.yml (NN the
notebook) with the reason it computes the same thing (an equivalent mutant: it passed every case at both launches,
race-free, within every limit), or is a hole in the check. The table gives, per exercise, mutants
made, killed, equivalent and surviving, their CPU seconds, and the wall seconds of the check of the
solution's copy (a right answer as a student submits it, checked first: it must pass); the exit
status is 1 when a mutant survives, a listed equivalent no longer does (or no longer exists), every
mutant of an exercise only raised, or a solution is refused. --sample N checks every N-th mutant of each
exercise only, the same ones every time (what make test runs).
"""

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = ROOT / "tests" / "equivalent_mutants"
# Wall seconds a worker may spend on one mutant before it is stopped; the check's own CPU budget
# stops a loop that never ends long before (checks.budget), so this is only a safety net.
WALL_LIMIT_S = 240


def load_equivalents(folder=EQUIVALENTS):
    """{exercise_id: {mutant key: reason}} from the YAML files of equivalent mutants, one a notebook
    (NN.yml: {exercise_id: [{change, at, why}]})."""
    import yaml
    found = {}
    for path in sorted(folder.glob("*.yml")):
        for exercise, mutants in (yaml.safe_load(path.read_text()) or {}).items():
            found[exercise] = {f"{m['change']} @ {m['at']}": m["why"] for m in mutants or ()}
    return found


def _init_worker():
    os.environ.setdefault("ATTENTION_LIB_BACKEND", "simulator")
    import attention_lib  # noqa: F401  (chooses the backend before Numba's CUDA loads)


def _check_one(task):
    """(exercise_id, index) -> (exercise_id, index, diagnosis, seconds); index None: the solution's
    copy (what a student who wrote the library's code submits), which must pass."""
    exercise_id, index = task
    from attention_lib.checks import EXERCISES, check, mutation
    exercise = EXERCISES[exercise_id]
    start = time.process_time()
    if index is None:                # wall time: the check's compile for a GPU runs in another process
        wall = time.perf_counter()
        return exercise_id, index, check(exercise_id, mutation.solution_copy(exercise), verbose=False).diagnosis, \
            time.perf_counter() - wall
    mutant = mutation.mutants(exercise)[index]
    try:
        answer = mutation.build(exercise, mutant.source, f"<mutant {mutant.mutant_id}>")
        diagnosis = check(exercise_id, answer, verbose=False).diagnosis
    except Exception as error:      # a mutant that does not even build (a syntax the catalogue made)
        diagnosis = f"not_built:{type(error).__name__}"
    return exercise_id, index, diagnosis, time.process_time() - start


def run(exercise_ids, sample=1, workers=2, report=print, solutions=None):
    """{exercise_id: [(mutant, diagnosis, seconds)]} for every sample-th mutant of each exercise; the
    check of each solution's copy goes into `solutions` ({exercise_id: (diagnosis, wall seconds)}),
    when a dict is given."""
    from attention_lib.checks import EXERCISES, mutation
    chosen = {e: mutation.mutants(EXERCISES[e]) for e in exercise_ids}
    tasks = [(e, None) for e in exercise_ids] if solutions is not None else []
    tasks += [(e, i) for e, found in chosen.items() for i in range(0, len(found), sample)]
    results = {e: [] for e in exercise_ids}
    context = multiprocessing.get_context("fork")
    pending = list(tasks)
    while pending:
        with context.Pool(workers, initializer=_init_worker) as pool:
            handles = [(task, pool.apply_async(_check_one, (task,))) for task in pending]
            pending = []
            for position, (task, handle) in enumerate(handles):
                try:
                    exercise_id, index, diagnosis, seconds = handle.get(timeout=WALL_LIMIT_S)
                except multiprocessing.TimeoutError:
                    exercise_id, index = task
                    if index is None:
                        solutions[exercise_id] = ("hung", float(WALL_LIMIT_S))
                    else:
                        results[exercise_id].append((chosen[exercise_id][index], "hung", float(WALL_LIMIT_S)))
                    pending = [t for t, _ in handles[position + 1:]]
                    pool.terminate()                   # a new pool for the rest
                    break
                if index is None:
                    solutions[exercise_id] = (diagnosis, seconds)
                    continue
                results[exercise_id].append((chosen[exercise_id][index], diagnosis, seconds))
                if len(results[exercise_id]) == len(range(0, len(chosen[exercise_id]), sample)):
                    report(f"{exercise_id}: {len(results[exercise_id])} mutants checked")
    return results


def verdicts(results, equivalents):
    """Per exercise: counts, surviving mutants, and listed equivalents that are wrong or gone."""
    table = {}
    for exercise_id, checked in results.items():
        listed = equivalents.get(exercise_id, {})
        survivors = [(m, d) for m, d, _ in checked if d == "ok" and m.key not in listed]
        equivalent = [m for m, d, _ in checked if d == "ok" and m.key in listed]
        killed_but_listed = [m for m, d, _ in checked if d != "ok" and m.key in listed]
        table[exercise_id] = {
            "made": len(checked), "killed": sum(d != "ok" for _, d, _ in checked), "equivalent": len(equivalent),
            "survived": [f"{m.mutant_id} line {m.line}: {m.change} (at: {m.at})" for m, _ in survivors],
            "listed_but_killed": [m.key for m in killed_but_listed],
            "cpu_s": round(sum(s for _, _, s in checked), 1),
            "diagnoses": sorted({d for _, d, _ in checked if d != "ok"}),
        }
        killed = [d for _, d, _ in checked if d != "ok"]
        # Every mutant refused for raising: the check probably cannot run the solution's mutants as
        # answers at all (the student submits something else than the mutated function).
        table[exercise_id]["only_errors"] = bool(killed) and all(
            d == "raised_error" or d.startswith("not_built") for d in killed)
    return table


def stale_listings(results, equivalents, sample):
    """Listed equivalents whose mutant the catalogue no longer makes (only known from a full run)."""
    if sample != 1:
        return []
    made = {e: {m.key for m, _, _ in checked} for e, checked in results.items()}
    return [f"{e}: {key}" for e, listed in equivalents.items() if e in made for key in listed if key not in made[e]]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("exercises", nargs="*", metavar="EXERCISE_ID")
    parser.add_argument("--sample", type=int, default=1, help="check every N-th mutant only")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the table as JSON here")
    options = parser.parse_args(argv)
    _init_worker()
    from attention_lib.checks import EXERCISES
    ids = options.exercises or [e for e, ex in EXERCISES.items() if ex.solution is not None]
    unknown = [e for e in ids if e not in EXERCISES]
    if unknown:
        sys.exit(f"mutants: unknown exercise {unknown[0]!r}; known: {', '.join(EXERCISES)}")
    start = time.time()
    solutions = {}
    results = run(ids, options.sample, options.workers, report=lambda line: print(line, flush=True),
                  solutions=solutions)
    equivalents = load_equivalents()
    table = verdicts(results, equivalents)
    for exercise_id, (diagnosis, seconds) in solutions.items():
        table[exercise_id].update(solution=diagnosis, solution_wall_s=round(seconds, 2))
    stale = stale_listings(results, equivalents, options.sample)
    print(f"\n{'exercise':22} {'made':>5} {'killed':>6} {'equiv':>5} {'survived':>8} {'cpu s':>7} {'right s':>7}")
    for exercise_id, row in table.items():
        print(f"{exercise_id:22} {row['made']:5} {row['killed']:6} {row['equivalent']:5} {len(row['survived']):8} "
              f"{row['cpu_s']:7.1f} {row['solution_wall_s']:7.2f}")
    slowest = max(table, key=lambda e: table[e]["solution_wall_s"])
    print(f"the check of a right answer (the solution's copy, compiled for a GPU where the exercise is GPU code, "
          f"{options.workers} at a time): at most {table[slowest]['solution_wall_s']:.1f} s ({slowest}), "
          f"{sum(r['solution_wall_s'] < 1 for r in table.values())} of {len(table)} under 1 s")
    failing = False
    for exercise_id, row in table.items():
        if row["solution"] != "ok":
            print(f"SOLUTION REFUSED {exercise_id}: its check says {row['solution']}")
            failing = True
    for exercise_id, row in table.items():
        for line in row["survived"]:
            print(f"SURVIVED {line}")
            failing = True
        for key in row["listed_but_killed"]:
            print(f"LISTED AS EQUIVALENT BUT KILLED {exercise_id}: {key}")
            failing = True
    for line in stale:
        print(f"LISTED AS EQUIVALENT BUT NOT MADE {line}")
        failing = True
    for exercise_id, row in table.items():
        if row["only_errors"] and (options.sample == 1 or row["made"] > 2):
            print(f"EVERY MUTANT RAISED {exercise_id}: the check may not run mutants of its solution as answers")
            failing = True
    print(f"{sum(r['made'] for r in table.values())} mutants in {time.time() - start:.0f} s")
    if options.json:
        options.json.write_text(json.dumps(table, indent=1) + "\n")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
