"""Uniform random policy on a multi-agent task, logged like a training run, so that the benchmark
tables of the multi-agent scripts show the baseline measured the same way as the agents.

    uv run python benchmark/random_policy.py --env-id vmas/navigation --seed 1 --total-timesteps 200000

It builds the task with cleanrl_utils.envs.multiagent (as every multi-agent script does), samples
every agent's action uniformly from its action space, and writes
runs/{env}__{exp_name}__{seed}__{time}/ with args.json and the scripts' TensorBoard keys, each the
mean over the episodes that ended since the last log: charts/episodic_return (the team return: the
sum over agents of their episode returns), charts/episodic_return_agent{i},
charts/episodic_return_mean_agent and charts/episodic_length. `python -m cleanrl_utils.results`
then scores it like any run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cleanrl_utils.envs.multiagent import check_env_id, make_env  # noqa: E402
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
    """the multi-agent script this baseline stands beside (recorded in args.json)"""
    exp_name: str = "random_policy"
    """the run's name in result tables"""
    track: bool = False
    """mirror to Weights & Biases (as the scripts' --track)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""
    save_model: bool = False
    """there is no model to save (Run's end-of-run step reads this)"""


def random_actions(env, generator: torch.Generator) -> torch.Tensor:
    shape = (env.num_envs, env.n_agents)
    if env.continuous:
        unit = torch.rand(*shape, env.act_dim, generator=generator, device=env.device)
        return env.action_low + (env.action_high - env.action_low) * unit
    return torch.randint(env.num_actions, shape, generator=generator, device=env.device)


def validate(args: Args) -> None:
    script = Path(args.script) if Path(args.script).is_file() else ROOT / args.script  # relative to the repository
    if not script.is_file():
        fail(f"--script {args.script} does not exist")
    if "cleanrl_utils.envs.multiagent" not in script.read_text():
        fail(
            f"--script {args.script} is not a multi-agent script (use mappo.py, qmix.py, vdn.py, maddpg.py or matd3.py)"
        )
    if args.num_envs <= 0 or args.total_timesteps < args.num_envs or args.log_every <= 0:
        fail("--num-envs and --log-every must be positive and --total-timesteps at least --num-envs")
    if args.max_episode_steps is not None and args.max_episode_steps <= 0:
        fail(f"--max-episode-steps must be positive, got {args.max_episode_steps}")
    check_env_id(args.env_id)


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    run = Run(args, __file__)  # seeds python, numpy and torch; makes the run directory
    device = torch.device("cpu")
    env = make_env(args.env_id, args.num_envs, device, args.seed, args.continuous_actions, args.max_episode_steps)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    env.reset()
    for step in range(1, args.total_timesteps // args.num_envs + 1):
        env.step(random_actions(env, generator))
        if step % args.log_every == 0 and (episodes := env.read_episodes()) is not None:
            global_step = step * args.num_envs
            run.log_episodes(global_step, returns=[episodes.team_return], lengths=[episodes.length])
            run.log(global_step, episodes.agent_scalars())
    env.close()
    run.finish(args.total_timesteps // args.num_envs * args.num_envs)
    print(f"{args.env_id}: random policy logged to {run.dir}")
