"""A uniformly random policy on a PettingZoo Atari game, measured as ppo_pettingzoo_ma_atari.py's saved models are:
its own evaluate() (the policy as first_0 against a uniformly random second_0, whole-game raw scores of first_0, the
same game seeds as a training run's evaluation: seed + 1000), and self-play games of the random policy logged like a
training run (charts/episodic_return per slot and per agent, charts/episodic_length), for the same-measure baseline.

    uv run --all-extras python benchmark/random_policy_pettingzoo_ma_atari.py --env-id pong_v3 --eval-episodes 20

The random policy is the script's Agent with its actor zeroed: logits 0, every action equally likely.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "cleanrl"))
import ppo_pettingzoo_ma_atari as script  # noqa: E402

from cleanrl_utils.checkpoint import save_model  # noqa: E402
from cleanrl_utils.envs.pettingzoo_atari import PettingZooAtariEnvs, check_env_id  # noqa: E402
from cleanrl_utils.run import Run  # noqa: E402


@dataclass
class Args:
    env_id: str = "pong_v3"
    """the PettingZoo Atari game"""
    seed: int = 1
    """seed of the self-play games and of the random actions; the evaluation uses seed + 1000, as a training run's"""
    total_timesteps: int = 40_000
    """self-play agent transitions to log (one step of all games counts num_envs)"""
    num_envs: int = 16
    """agent slots (games x 2)"""
    eval_episodes: int = 20
    """games of the evaluation (as first_0 against a random second_0)"""
    max_cycles: int = 100_000
    """PettingZoo's time limit in emulator frames"""
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


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_env_id(args.env_id)
    run = Run(args, __file__)
    envs = PettingZooAtariEnvs(args.env_id, args.num_envs // 2, args.seed, args.max_cycles)
    envs.reset()
    rng = np.random.default_rng(args.seed)
    global_step = 0
    while global_step < args.total_timesteps:
        _, _, _, _, infos = envs.step(rng.integers(envs.n_actions, size=envs.num_envs))
        global_step += envs.num_envs
        run.log_episodes(global_step, infos)
        script.log_agent_episodes(run, global_step, infos, envs.agents)
        if global_step % 2048 < envs.num_envs:
            run.log(global_step, {})
    envs.close()

    agent = script.Agent(envs.obs_shape[0], envs.n_agents, envs.n_actions)
    torch.nn.init.zeros_(agent.actor.weight)
    torch.nn.init.zeros_(agent.actor.bias)
    model_path = run.dir / "random.cleanrl_model"
    model_args = script.Args(env_id=args.env_id, max_cycles=args.max_cycles)
    save_model(model_path, model_args, script.__file__, agent=agent.state_dict(), n_agents=2, n_actions=envs.n_actions)
    scores = script.evaluate(model_path, args.eval_episodes, torch.device("cpu"), seed=args.seed + 1_000)
    for idx, score in enumerate(scores):
        run.writer.add_scalar("eval/episodic_return", score, idx)
    run.finish(global_step)
    print(
        f"{args.env_id}: random policy as first_0 vs random: {np.mean(scores):.2f} +- {np.std(scores):.2f} "
        f"over {len(scores)} games; logged to {run.dir}"
    )
