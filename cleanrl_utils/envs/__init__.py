"""Environment plumbing shared by the scripts: adapters that give a simulator the batched
interface the scripts use (what gymnasium's vector envs and RecordEpisodeStatistics do for the
single-agent scripts). Nothing here changes what an agent learns.

- `multiagent`: VMAS scenarios and mpe2 tasks as [num_envs, n_agents, ...] tensors.
- `atari`: ALE (ale-py's C++ vector env) and MinAtar games as whole games of uint8 frames, NEXT_STEP autoreset.
- `envpool_atari`: envpool's Atari games with the same interface.
- `procgen`: envpool's Procgen games.
- `point_chasing`: ElegantRL's PointChasing-v0, a NumPy env and a torch-batched vector env on the training device.
- `mujoco_warp_env`: gymnasium's v5 MuJoCo tasks on MuJoCo Warp, thousands of worlds as torch tensors on one device.
- `isaacgym_env`: isaacgymenvs's vector tasks behind the same interface (Python 3.8 syntax, as Isaac Gym).
- `proof_of_memory`: ProofofMemory-v0, a small task that only an agent with memory solves (cleanrl/ppo_trxl.py).
- `stock_trading`, `stock_data`: FinRL's StockTrading-v0 (single and torch-batched) and its prices and indicators.
"""
