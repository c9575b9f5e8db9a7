"""Uniform random policy on a multi-agent task, logged like a training run, so that the benchmark
tables of the multi-agent scripts show the baseline measured the same way as the agents.

    uv run python benchmark/random_policy.py --env-id vmas/navigation --seed 1 --total-timesteps 200000

It builds the environment with the environment section of a multi-agent script (`--script`, default
cleanrl/mappo.py; all five carry the same section), samples every agent's action uniformly from its
action space, and writes runs/{env}__random_policy__{seed}__{time}/ with args.json and the same
TensorBoard keys: charts/episodic_return (team return: the sum over agents of their episode returns,
averaged over the episodes that ended since the last log), charts/episodic_return_agent{i},
charts/episodic_length. `python -m cleanrl_utils.results` then scores it like any run.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cleanrl_utils.errors import fail  # noqa: E402
from cleanrl_utils.run import Run  # noqa: E402


@dataclass
class Args:
    env_id: str = "vmas/navigation"
    """the multi-agent task: vmas/<scenario> or mpe/<task>"""
    seed: int = 1
    """seed of the environments and of the random actions"""
    total_timesteps: int = 200_000
    """environment steps to run (one step of all num_envs worlds counts num_envs)"""
    num_envs: int = 64
    """parallel worlds"""
    continuous_actions: bool = True
    """build the simulator with continuous actions (else discrete), as the script being compared does"""
    max_episode_steps: int | None = None
    """episode length limit; None: VMAS 100, MPE 25 (the scripts' default)"""
    log_every: int = 10
    """log the episodes that ended every this many vector steps"""
    script: str = "cleanrl/mappo.py"
    """the multi-agent script whose environment section builds the task"""
    exp_name: str = "random_policy"
    """the run's name in result tables"""
    track: bool = False
    """mirror to Weights & Biases (as the scripts' --track)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""


def load_env_section(script: str):
    spec = importlib.util.spec_from_file_location(Path(script).stem, script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the script's main() is guarded by __name__ == "__main__"
    return module


def random_actions(env, generator: torch.Generator) -> torch.Tensor:
    shape = (env.num_envs, env.n_agents)
    if env.continuous:
        unit = torch.rand(*shape, env.act_dim, generator=generator, device=env.device)
        return env.action_low + (env.action_high - env.action_low) * unit
    return torch.randint(env.num_actions, shape, generator=generator, device=env.device)


if __name__ == "__main__":
    args = tyro.cli(Args)
    if not Path(args.script).is_file() and (ROOT / args.script).is_file():
        args.script = str(ROOT / args.script)  # a path relative to the repository, run from elsewhere
    if not Path(args.script).is_file():
        fail(f"--script {args.script} does not exist")
    if args.num_envs <= 0 or args.total_timesteps < args.num_envs or args.log_every <= 0:
        fail("--num-envs and --log-every must be positive and --total-timesteps at least --num-envs")
    if args.max_episode_steps is not None and args.max_episode_steps <= 0:
        fail(f"--max-episode-steps must be positive, got {args.max_episode_steps}")
    section = load_env_section(args.script)
    if not all(hasattr(section, name) for name in ("check_env_id", "make_env", "VMASVecEnv", "MPEVecEnv")):
        fail(
            f"--script {args.script} has no multi-agent environment section (use mappo.py, qmix.py, vdn.py, maddpg.py or matd3.py)"
        )
    if (message := section.check_env_id(args.env_id)) is not None:
        fail(message)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    env = section.make_env(
        args.env_id, args.num_envs, device, args.seed, args.continuous_actions, args.max_episode_steps
    )
    generator = torch.Generator(device=device).manual_seed(args.seed)
    run = Run(args)
    env.reset()
    return_sum = torch.zeros(env.n_agents)
    length_sum = torch.zeros(())
    finished = torch.zeros(())
    for step in range(1, args.total_timesteps // args.num_envs + 1):
        *_, info = env.step(random_actions(env, generator))
        done = info["done"].float()
        return_sum += (info["episode_return"] * done.unsqueeze(1)).sum(0)
        length_sum += (info["episode_length"] * done).sum()
        finished += done.sum()
        if step % args.log_every == 0 and finished > 0:
            global_step = step * args.num_envs
            run.writer.add_scalar("charts/episodic_return", (return_sum.sum() / finished).item(), global_step)
            for agent in range(env.n_agents):
                run.writer.add_scalar(
                    f"charts/episodic_return_agent{agent}", (return_sum[agent] / finished).item(), global_step
                )
            run.writer.add_scalar("charts/episodic_length", (length_sum / finished).item(), global_step)
            return_sum.zero_(), length_sum.zero_(), finished.zero_()
    env.close()
    run.close()
    print(f"{args.env_id}: random policy logged to {run.dir}")
