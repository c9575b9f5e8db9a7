"""What FIRE after a lost life changes on Breakout (benchmark/atari_fire.sh runs it; results in
benchmark/results/atari_fire.md):

    uv run --extra atari python benchmark/atari_fire.py fixed --policy noop --seeds 1 2 3           # the default
    uv run --extra atari python benchmark/atari_fire.py fixed --policy noop --seeds 1 2 3 --off     # old semantics
    uv run --extra atari python benchmark/atari_fire.py sps --repeats 3                              # acting only

`fixed`: one game per seed with a policy that never picks FIRE (always NOOP or always RIGHT), built by the pixel
scripts' make_envs (ale-py, or envpool with --envpool); prints one CSV row per game: its length in agent steps and in
Atari frames (the 108,000-frame cap included), its raw score and the lives it lost. --off passes episodic_life=False
(no FIRE after a lost life, the game goes on: the semantics before FIRE was added); run on an older checkout (its
cleanrl_utils first on PYTHONPATH), it plays that checkout's default and labels the rows "before". `sps`: environment
steps per second of 8 games under random actions, acting only (no network), and the CPU seconds (all threads) per
1,000 of them (one CSV row per repeat: env_id, env steps/s, CPU s per 1000 env steps); it passes no keyword, so on an
older checkout it times that checkout's default.
"""

from __future__ import annotations

import argparse
import time
from inspect import signature

import numpy as np

from cleanrl_utils.envs import atari, envpool_atari
from cleanrl_utils.envs.atari import make_envs

POLICIES = {"noop": 0, "right": 2}  # Breakout's minimal action set: NOOP, FIRE, RIGHT, LEFT


def make(env_id: str, num_envs: int, envpool: bool, off: bool):
    kwargs = {"episodic_life": False} if off else {}
    return (envpool_atari.make_envs if envpool else atari.make_envs)(env_id, num_envs, **kwargs)


def fixed(args) -> None:
    env_id = "Breakout-v5" if args.envpool else "BreakoutNoFrameskip-v4"
    print("env_id,semantics,policy,seed,steps,frames,score,lives_lost,ended_by")
    for seed in args.seeds:
        envs = make(env_id, 1, args.envpool, args.off)
        envs.reset(seed=seed)
        action, lives_lost, steps = np.array([POLICIES[args.policy]]), 0, 0
        while True:
            _, _, terminated, truncated, infos = envs.step(action)
            steps += 1
            lives_lost += int(infos["life_loss"][0])
            if "episode" in infos and infos["_episode"][0]:
                break
        # ale-py counts the game's frames; envpool counts its steps (4 frames each, the cap 27,000 steps)
        frames = int(infos["episode_frame_number"][0]) if "episode_frame_number" in infos else 4 * steps
        ended_by = "truncation" if truncated[0] else "game over"
        semantics = "off" if args.off else "on" if "episodic_life" in signature(make_envs).parameters else "before"
        score, length = float(infos["episode"]["r"][0]), int(infos["episode"]["l"][0])
        print(f"{env_id},{semantics},{args.policy},{seed},{length},{frames},{score:g},{lives_lost},{ended_by}")
        envs.close()


def sps(args) -> None:
    rng = np.random.default_rng(0)
    for repeat in range(args.repeats):
        envs = (envpool_atari.make_envs if args.envpool else atari.make_envs)(args.env_id, 8)
        envs.reset(seed=repeat)
        n = envs.single_action_space.n
        for _ in range(100):  # warm-up
            envs.step(rng.integers(n, size=8))
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            envs.step(rng.integers(n, size=8))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        # CPU time (all threads of the process) per 1,000 env steps: steadier than SPS on a shared machine
        print(f"{args.env_id},{8 * args.steps / elapsed:.0f},{1000 * cpu / (8 * args.steps):.3f}", flush=True)
        envs.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("fixed", help="game length and score of a policy that never picks FIRE")
    one.add_argument("--policy", choices=sorted(POLICIES), default="noop")
    one.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    one.add_argument("--off", action="store_true", help="episodic_life=False: no FIRE after a lost life")
    one.add_argument("--envpool", action="store_true", help="envpool's Breakout-v5 instead of ale-py's")
    speed = commands.add_parser("sps", help="acting-only env steps per second, 8 envs, random actions")
    speed.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    speed.add_argument("--envpool", action="store_true", help="--env-id is an envpool id (Breakout-v5)")
    speed.add_argument("--steps", type=int, default=2000)
    speed.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    fixed(args) if args.command == "fixed" else sps(args)
