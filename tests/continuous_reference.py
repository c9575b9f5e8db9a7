"""Plain references for the tests that run the continuous-action scripts' own loops (tests/probe.py): the networks
read from their state dicts (never through the scripts' forward()), in float64, and what the env returned, written
from the definitions. Shared by test_td3_ddpg.py, test_sac.py and test_redq.py."""

from __future__ import annotations

import numpy as np
import torch


def linear(x: torch.Tensor, state: dict, name: str) -> torch.Tensor:
    return x.double() @ state[f"{name}.weight"].double().T + state[f"{name}.bias"].double()


def deterministic_actor(state: dict, obs: torch.Tensor) -> torch.Tensor:
    """TD3's and DDPG's actor: tanh of a ReLU MLP (fc1, fc2, fc_mu), scaled to the bounds."""
    h = linear(linear(obs, state, "fc1").relu(), state, "fc2").relu()
    return torch.tanh(linear(h, state, "fc_mu")) * state["action_scale"].double() + state["action_bias"].double()


def policy_head(state: dict, obs: torch.Tensor, log_std_bounds=(-5.0, 2.0)) -> tuple[torch.Tensor, torch.Tensor]:
    """SAC's and REDQ's policy before the squashing: the mean and log std of u at `obs` (a ReLU MLP fc1, fc2 with the
    heads fc_mean and fc_logstd; the log std is tanh of its head mapped onto the bounds)."""
    h = linear(linear(obs, state, "fc1").relu(), state, "fc2").relu()
    low, high = log_std_bounds
    return linear(h, state, "fc_mean"), low + 0.5 * (high - low) * (torch.tanh(linear(h, state, "fc_logstd")) + 1)


def squashed_gaussian(state: dict, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's action at `noise` (N(0, I) draws): u = mean + std * noise, a = tanh(u) * scale + bias, and
    log pi(a|s) = log N(u; mean, std) - sum log |da/du| (the change of variables), summed over the action dimensions."""
    mean, log_std = policy_head(state, obs)
    u = mean + log_std.exp() * noise.double()
    scale, bias = state["action_scale"].double(), state["action_bias"].double()
    normal = torch.distributions.Normal(mean, log_std.exp())
    log_prob = normal.log_prob(u).sum(-1) - torch.log(scale * (1 - torch.tanh(u) ** 2)).sum(-1)
    return torch.tanh(u) * scale + bias, log_prob


def stacked_critic(state: dict, i: int, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Critic i of the scripts' stacked critics (TD3, SAC, REDQ): Q(s, a) [batch], each layer x W + b with w1, w2
    [critic, in, out], b1, b2 [critic, 1, out] and the output unit w3 [critic, 1, hidden], b3 [critic, 1]."""
    s = {key: value.double() for key, value in state.items()}
    x = torch.cat([obs, actions], dim=-1).double()
    h = (x @ s["w1"][i] + s["b1"][i]).relu()
    h = (h @ s["w2"][i] + s["b2"][i]).relu()
    return (h @ s["w3"][i].T).squeeze(-1) + s["b3"][i]


def buffer_rows(rb: dict, obs_dim: int, action_dim: int) -> dict:
    """A replay buffer's state dict split into its columns: obs, next_obs, actions, rewards, terminations."""
    bounds = np.cumsum([0, obs_dim, obs_dim, action_dim, 1, 1])
    names = ["obs", "next_obs", "actions", "rewards", "terminations"]
    return {name: rb["data"][:, a:b] for name, a, b in zip(names, bounds, bounds[1:])}


def row_key(fields: dict, i: int) -> tuple:
    """Row i of named columns (a buffer's or a sampled batch's), as one hashable tuple."""
    names = ["obs", "next_obs", "actions", "rewards", "terminations"]
    return tuple(torch.cat([torch.as_tensor(fields[name][i]).reshape(-1) for name in names]).tolist())


def true_next_obs(step: dict, env: int, next_obs_name: str = "next_obs_np") -> np.ndarray:
    """What the env returned as env `env`'s next observation: the true final one where an episode ended."""
    if step["terminations"][env] or step["truncations"][env]:
        return step["infos"]["final_obs"][env]
    return step[next_obs_name][env]


def check_stored_rows(steps: list[dict], rb: dict, obs_dim: int, action_dim: int, actions_name: str) -> dict:
    """Every step of every env is the buffer row num_envs * t + env, holding the observation acted on, the actions the
    env got, the reward, the termination flag (not the truncation's) and the true next observation; the loop acts
    next on what the env returned. Returns the count of terminations and truncations seen."""
    rows = buffer_rows(rb, obs_dim, action_dim)
    num_envs = len(steps[0]["rewards"])
    assert rb["size"] == num_envs * len(steps)
    ends = {"terminations": 0, "truncations": 0}
    for t, step in enumerate(steps):
        for env in range(num_envs):
            row, where = num_envs * t + env, f"step {t}, env {env}"
            assert torch.equal(rows["obs"][row], torch.as_tensor(step["obs_np"][env])), where
            assert torch.equal(rows["actions"][row], torch.as_tensor(step[actions_name][env])), where
            assert rows["rewards"][row].item() == np.float32(step["rewards"][env]), where
            assert rows["terminations"][row].item() == float(step["terminations"][env]), where
            assert torch.equal(rows["next_obs"][row], torch.as_tensor(true_next_obs(step, env))), where
            if step["terminations"][env] or step["truncations"][env]:
                assert not np.array_equal(true_next_obs(step, env), step["next_obs_np"][env])  # not the reset one
                ends["terminations" if step["terminations"][env] else "truncations"] += 1
            if t + 1 < len(steps):  # the loop acts next on what the env returned (the reset observation after an end)
                assert np.array_equal(steps[t + 1]["obs_np"][env], np.asarray(step["next_obs_np"][env]).reshape(-1))
    return ends


def adam_step(param: torch.Tensor, grad: torch.Tensor, state: dict, group: dict) -> torch.Tensor:
    """One step of Adam (Kingma and Ba 2015) from the optimiser state before it (step count, first and second
    moments; empty before the first step): the parameter after the step, in float64."""
    beta1, beta2 = group["betas"]
    step = float(state["step"]) + 1 if state else 1.0
    m = torch.as_tensor(state["exp_avg"]).double() if state else torch.zeros_like(grad)
    v = torch.as_tensor(state["exp_avg_sq"]).double() if state else torch.zeros_like(grad)
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad**2
    m_hat, v_hat = m / (1 - beta1**step), v / (1 - beta2**step)
    return param.double() - group["lr"] * m_hat / (v_hat.sqrt() + group["eps"])


def policy_and_alpha_step(
    entry: dict, policy_loss, target_entropy: float, parameter_names: list[str]
) -> tuple[dict, torch.Tensor]:
    """The actor and log_alpha after one step of the actor's optimiser (parameter group 0: the actor's parameters in
    `parameter_names` order, group 1: log_alpha) on SAC's two losses at `entry` (a backward of the policy step): the
    gradient of `policy_loss(actor_params)` for the actor (alpha held constant), and for log_alpha the gradient of
    -exp(log_alpha) * mean(log pi + target_entropy) with log pi held constant: -exp(log_alpha) * that mean."""
    params = {name: entry["actor"][name].double().clone().requires_grad_(True) for name in parameter_names}
    loss, log_prob = policy_loss({**entry["actor"], **params})
    grads = torch.autograd.grad(loss, [params[name] for name in parameter_names])
    log_alpha = entry["log_alpha"].double()
    alpha_grad = -log_alpha.exp() * (log_prob.detach() + target_entropy).mean()
    optimizer = entry["actor_optimizer"]
    groups, states = optimizer["param_groups"], optimizer["state"]
    new_actor = {
        name: adam_step(params[name].detach(), grad, states.get(index, {}), groups[0])
        for index, (name, grad) in enumerate(zip(parameter_names, grads))
    }
    new_log_alpha = adam_step(log_alpha, alpha_grad, states.get(len(parameter_names), {}), groups[1])
    return new_actor, new_log_alpha


def gaussian_residuals(actions: np.ndarray, mean: torch.Tensor, log_std: torch.Tensor, scale, bias) -> torch.Tensor:
    """(atanh of the action mapped onto [-1, 1] - mean) / std: standard normal for a sample of the squashed Gaussian."""
    squashed = ((torch.as_tensor(actions).double() - bias) / scale).clamp(-1 + 1e-6, 1 - 1e-6)
    return (torch.atanh(squashed) - mean) / log_std.exp()


# --- on-policy loops (ppo_continuous_action.py and its H-term variant) -----------------------------------------------


PPO_RESULTS = ("action", "next_obs_np", "reward", "terminated", "truncated", "infos")  # ppo_continuous_action's names


def rollout_stream(trace, num_steps: int, results=PPO_RESULTS, start_step: int = 0) -> list[dict]:
    """One dict per step of a PPO loop that counts global_step at the top of its step loop (a probe entry there holds
    the observation about to be acted on and the previous step's results): "obs" (next_obs, normalised as the policy
    saw it), "obs_rms" (the statistics that normalised it), "iteration", "step" (the index in the rollout), "noise"
    (that step's N(0, I) draws, where the loop keeps them) and the step's `results` (from the next entry, or from the
    script's globals at the end for the last step). `start_step`: the step the run started from (a resumed run)."""
    entries = [entry for entry in trace.steps if entry["step"] > start_step]
    stream = []
    for k, entry in enumerate(entries):
        after = entries[k + 1] if k + 1 < len(entries) else trace.final
        step = k % num_steps
        assert entry["step"] == start_step + (k + 1) * len(entry["next_obs"]), "one entry per step of the loop"
        noise = {"noise": entry["noise"][step]} if "noise" in entry else {}
        stream.append(
            {"obs": entry["next_obs"], "obs_rms": entry["obs_rms"], "iteration": entry["iteration"], "step": step}
            | noise
            | {name: after[name] for name in results}
        )
    return stream


def merge_statistics(stats: dict, batch: np.ndarray) -> dict:
    """A running mean / variance ({"mean", "var", "count"}) after one more batch of rows, from the pooled definition:
    the mean and population variance of everything seen, the old data summarised by its count, mean and variance."""
    count, n = stats["count"], len(batch)
    total = count + n
    mean = (count * stats["mean"] + batch.sum(0)) / total
    second_moment = count * (stats["var"] + stats["mean"] ** 2) + (batch**2).sum(0)
    return {"mean": mean, "var": second_moment / total - mean**2, "count": total}


def normalise(x, stats: dict, clip: float) -> np.ndarray:
    return np.clip((np.asarray(x, dtype=np.float64) - stats["mean"]) / np.sqrt(stats["var"] + 1e-8), -clip, clip)


def rms_state(state: dict) -> dict:
    """A RunningMeanStd's state dict as {"mean", "var", "count"} in float64."""
    count = state["_extra_state"]["count"] if "_extra_state" in state else float(state["count"])
    return {"mean": state["mean"].double().numpy(), "var": state["var"].double().numpy(), "count": count}


def gaussian_policy(state: dict, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's policy from the agent's state dict: the mean (a tanh MLP, actor_mean.0/2/4) and the state-independent
    log std (actor_logstd)."""
    h = torch.tanh(linear(obs, state, "actor_mean.0"))
    h = torch.tanh(linear(h, state, "actor_mean.2"))
    return linear(h, state, "actor_mean.4"), state["actor_logstd"].double()


def state_value(state: dict, obs: torch.Tensor) -> torch.Tensor:
    """PPO's value network from the agent's state dict (a tanh MLP, critic.0/2/4)."""
    h = torch.tanh(linear(obs, state, "critic.0"))
    return linear(torch.tanh(linear(h, state, "critic.2")), state, "critic.4").squeeze(-1)


def ppo_loss(state: dict, mb: dict, clip_coef: float, vf_coef: float, clip_vloss: bool = True) -> torch.Tensor:
    """The clipped surrogate and the value loss (clipped as CleanRL does, or not) of one minibatch (its advantages as
    given), written out from Schulman et al. 2017; no entropy bonus (--ent-coef 0)."""
    mean, log_std = gaussian_policy(state, mb["obs"])
    policy = torch.distributions.Normal(mean, log_std.exp())
    ratio = (policy.log_prob(mb["actions"].double()).sum(-1) - mb["logprobs"].double()).exp()
    advantages = mb["advantages"].double()
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip_coef, 1 + clip_coef) * advantages)
    value = state_value(state, mb["obs"])
    old_value, returns = mb["values"].double(), mb["returns"].double()
    value_loss = 0.5 * ((value - returns) ** 2).mean()
    if clip_vloss:
        clipped_value = old_value + (value - old_value).clamp(-clip_coef, clip_coef)
        value_loss = 0.5 * torch.maximum((value - returns) ** 2, (clipped_value - returns) ** 2).mean()
    return -surrogate.mean() + vf_coef * value_loss
