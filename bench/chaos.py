"""Crash points, long: many chaos rounds (testbed/chaos.py) in one test machine, and a table.

Run as root from the repository: `python -m bench.chaos --rounds 10`. Each round starts
`--tasks` fake tasks that log steps, write files, pay through wallet.pay and ask questions, while
a script plays the owner; at seeded random moments it kills the manager, a broker, a worker or
the gateway with SIGKILL, or cuts the power (the machine killed at once and booted again from the
same disks). After each round the box is held to its promises; every problem is printed with
its round's seed, which `BOXD_CHAOS_SEED=<seed> python -m bench.chaos --rounds 1` replays (with
the same --tasks and --strikes). The later rounds' seeds are drawn from the first.
"""

import argparse
import random
import sys
import time
from pathlib import Path

TASKS = 20
ROUNDS = 5
STRIKES = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--tasks", type=int, default=TASKS, help="tasks per round")
    parser.add_argument("--strikes", type=int, default=STRIKES, help="kills per round")
    arguments = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from testbed.chaos import Figures, round_seed, run_round, table
    from testbed.machine import Machine, install_boxd

    first = round_seed()
    seeds = random.Random(first)
    figures = Figures()
    started = time.monotonic()
    with Machine() as machine:
        install_boxd(machine)
        token = machine.run("boxctl", "token", "create").stdout.strip()
        for number in range(arguments.rounds):
            seed = first if number == 0 else seeds.randrange(2**32)
            run_round(
                machine,
                token,
                seed,
                arguments.tasks,
                arguments.strikes,
                figures,
            )
            print(table(figures), flush=True)
    print(
        f"\n{arguments.rounds} rounds of {arguments.tasks} tasks and {arguments.strikes} "
        f"strikes in {time.monotonic() - started:.0f} s (first seed {first})"
    )
    print(table(figures))
    for words, count in figures.failures.most_common():
        print(f"failed {count}x: {words}")
    for problem in figures.problems:
        print(f"PROBLEM: {problem}")
    sys.exit(1 if figures.problems else 0)


if __name__ == "__main__":
    main()
