"""PettingZoo's multi-agent Atari games (pong_v3, boxing_v2, ...) as one vector env for parameter-sharing scripts.

    envs = PettingZooAtariEnvs("pong_v3", num_games=8, seed=1)
    obs = envs.reset()                                           # uint8 [num_games * n_agents, 4, 84, 84]
    obs, rewards, terminated, truncated, infos = envs.step(actions)  # actions [num_games * n_agents]

Slot `g * n_agents + i` is agent i (envs.agents[i]: first_0, second_0, ...) of game g, the layout of SuperSuit's
`concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env))` that CleanRL uses. Every agent of a game sees the same screen.
Rewards are each agent's raw (unclipped) game reward summed over the skipped frames; clipping is the script's business.

Preprocessing, as for single-agent Atari (DQN paper): the joint action repeated for 4 emulator frames, the observation
the max over the last two, ALE's grayscale, resized to 84x84 (area interpolation), 4 stacked frames, oldest first,
zeros before a game's first frame. PettingZoo's emulator has no sticky actions and no random no-ops; its time limit is
`max_cycles` emulator frames (PettingZoo's default 100,000), where games are truncated.

A game ends for all of its agents at once (terminated when any agent's episode ends, as SuperSuit's vec env requires:
it has no agent death either). Autoreset is NEXT_STEP, as in ale-py's vector env: the step after a game ends ignores its
actions and returns the first observation of a new game, with zero rewards and no end flags.
`infos["episode"]["r"]` / `["l"]` with the mask `infos["_episode"]` are each slot's whole-game raw return and length
(agent steps), on the step that ended the game (gymnasium's RecordEpisodeStatistics layout, per slot).

Why not SuperSuit's wrappers: its `concat_vec_envs_v1` resets a finished game inside the same step and returns only the
new game's observation (no final observation for a truncated game's bootstrap), its episode statistics come from
gymnasium's RecordEpisodeStatistics on clipped rewards when `clip_reward_v0` precedes it, and its wrappers' state (frame
stacks, pending resets) cannot be saved. Here `state_dict()` / `load_state_dict()` hold every game's full emulator state
(ALE's cloneSystemState, its random generator included), frame counter, frame stack and running returns, so a
checkpointed run continues exactly. The ROMs are the ones ale-py ships (no AutoROM download).
"""

from __future__ import annotations

import difflib
import importlib
import os

import numpy as np

from cleanrl_utils.errors import fail

N_AGENTS = 2  # every game in KNOWN_ENV_IDS has two players
FRAME_SKIP = 4
STACK = 4
SIZE = 84
# The two-player games whose agents share one action space and end their episodes together (parameter sharing, one
# game end for all): the games of PettingZoo's Atari family that CleanRL's script runs.
KNOWN_ENV_IDS = (
    "basketball_pong_v3",
    "boxing_v2",
    "combat_plane_v2",
    "combat_tank_v2",
    "double_dunk_v3",
    "entombed_competitive_v3",
    "entombed_cooperative_v3",
    "flag_capture_v2",
    "ice_hockey_v2",
    "joust_v3",
    "mario_bros_v3",
    "maze_craze_v3",
    "othello_v3",
    "pong_v3",
    "space_invaders_v2",
    "space_war_v2",
    "surround_v2",
    "tennis_v3",
    "video_checkers_v4",
    "wizard_of_wor_v3",
)


def check_env_id(env_id: str) -> None:
    """Fail in one line, naming the nearest known ids, unless env_id is one of KNOWN_ENV_IDS."""
    if env_id in KNOWN_ENV_IDS:
        return
    near = difflib.get_close_matches(env_id, KNOWN_ENV_IDS, n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(near)}? " if near else ""
    fail(f"unknown --env-id {env_id!r}; {hint}known PettingZoo Atari games: {', '.join(KNOWN_ENV_IDS)}")


def make_game(env_id: str, max_cycles: int):
    """The raw PettingZoo parallel env (ParallelAtariEnv, grayscale screens), loading the ROM that ships with ale-py."""
    import ale_py.roms

    module = importlib.import_module(f"pettingzoo.atari.{env_id}")
    rom_dir = os.path.dirname(ale_py.roms.get_rom_path("pong"))  # ale-py keeps all of its ROMs in one folder
    env = module.parallel_env(obs_type="grayscale_image", max_cycles=max_cycles, auto_rom_install_path=rom_dir)
    return env.unwrapped


class PettingZooAtariEnvs:
    """`num_games` games of one PettingZoo Atari id, stepped one after another on the host (see the module's text)."""

    def __init__(self, env_id: str, num_games: int, seed: int, max_cycles: int = 100_000):
        import cv2

        self._resize = lambda frame: cv2.resize(frame, (SIZE, SIZE), interpolation=cv2.INTER_AREA)
        self.env_id, self.num_games, self.seed = env_id, num_games, seed
        self.games = [make_game(env_id, max_cycles) for _ in range(num_games)]
        self.agents = list(self.games[0].possible_agents)
        self.n_agents = len(self.agents)
        self.num_envs = num_games * self.n_agents
        self.n_actions = int(self.games[0].action_space(self.agents[0]).n)
        self.obs_shape = (STACK, SIZE, SIZE)
        self.stacks = np.zeros((num_games, STACK, SIZE, SIZE), dtype=np.uint8)
        self.returns = np.zeros((num_games, self.n_agents))
        self.lengths = np.zeros(num_games, dtype=np.int64)
        self.ended = np.zeros(num_games, dtype=bool)  # the game ended last step: this step resets it

    def _new_game(self, g: int, seed: int | None = None) -> None:
        frames, _ = self.games[g].reset(seed=seed)
        self.stacks[g] = 0
        self.stacks[g, -1] = self._resize(frames[self.agents[0]])
        self.returns[g], self.lengths[g], self.ended[g] = 0.0, 0, False

    def _observations(self) -> np.ndarray:
        return np.repeat(self.stacks, self.n_agents, axis=0)  # every agent of a game sees its screen

    def reset(self) -> np.ndarray:
        """Start every game, game g seeded with seed + g."""
        for g in range(self.num_games):
            self._new_game(g, seed=self.seed + g)
        return self._observations()

    def step(self, actions: np.ndarray):
        actions = np.asarray(actions).reshape(self.num_games, self.n_agents)
        rewards = np.zeros((self.num_games, self.n_agents), dtype=np.float32)
        terminated = np.zeros(self.num_games, dtype=bool)
        truncated = np.zeros(self.num_games, dtype=bool)
        for g, game in enumerate(self.games):
            if self.ended[g]:  # NEXT_STEP autoreset: this step's actions are ignored
                self._new_game(g)
                continue
            joint = {agent: int(a) for agent, a in zip(self.agents, actions[g])}
            previous = screen = None
            for _ in range(FRAME_SKIP):
                frames, reward, term, trunc, _ = game.step(joint)
                previous, screen = screen, frames[self.agents[0]]
                rewards[g] += [reward[agent] for agent in self.agents]
                terminated[g], truncated[g] = any(term.values()), any(trunc.values())
                if terminated[g] or truncated[g]:
                    break
            if previous is not None:  # the max over the last two frames (flicker)
                screen = np.maximum(previous, screen)
            self.stacks[g, :-1] = self.stacks[g, 1:]
            self.stacks[g, -1] = self._resize(screen)
            self.returns[g] += rewards[g]
            self.lengths[g] += 1
        ended = terminated | truncated
        infos = {}
        if ended.any():
            slots = np.repeat(ended, self.n_agents)
            infos["episode"] = {"r": self.returns.reshape(-1).copy(), "l": np.repeat(self.lengths, self.n_agents)}
            infos["_episode"] = slots
        self.ended = ended
        per_slot = lambda x: np.repeat(x, self.n_agents)  # noqa: E731
        return self._observations(), rewards.reshape(-1), per_slot(terminated), per_slot(truncated), infos

    def state_dict(self) -> dict:
        """Everything a resumed run needs to continue these games exactly."""
        return dict(
            emulators=[game.clone_full_state() for game in self.games],
            frames=[game.frame for game in self.games],
            live_agents=[list(game.agents) for game in self.games],
            stacks=self.stacks.copy(),
            returns=self.returns.copy(),
            lengths=self.lengths.copy(),
            ended=self.ended.copy(),
        )

    def load_state_dict(self, state: dict) -> np.ndarray:
        """Restore `state_dict()`'s games; returns the observation the next step acts on."""
        for game, emulator, frame, live in zip(self.games, state["emulators"], state["frames"], state["live_agents"]):
            game.restore_full_state(emulator)
            game.frame, game.agents = frame, list(live)
        self.stacks[:], self.returns[:], self.lengths[:] = state["stacks"], state["returns"], state["lengths"]
        self.ended[:] = state["ended"]
        return self._observations()

    def close(self) -> None:
        for game in self.games:
            game.close()
