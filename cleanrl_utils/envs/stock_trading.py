"""StockTrading-v0: FinRL's stock trading environment (finrl/meta/env_stock_trading/env_stocktrading.py), a NumPy
gymnasium env and a torch-batched vector env of many portfolios on the training device, registered on import.

    env = gym.make("StockTrading-v0", tickers=["AAPL", "MSFT", "JPM"])         # StockTradingEnv: one portfolio
    envs = gym.make_vec("StockTrading-v0", num_envs=4096, vectorization_mode="vector_entry_point", device="cuda")
    python cleanrl/sac_continuous_action.py --env-id StockTrading-v0 --env-options '{"test_start": "2021-01-01"}'

Data (cleanrl_utils/envs/stock_data.py): `data` "default" (20 S&P 500 stocks' daily closes, shipped in skfolio) or a
CSV in FinRL's long format; `tickers` (default: all). Periods as FinRL's data_split (start included, end excluded):
training [train_start, test_start), test [test_start, test_end); test_end None runs to the data's last day.
Data that cannot be traded as they are (a date missing for one ticker, a missing high, an unadjusted split, a
ticker listed after train_start ...: stock_data's docstring) stop with one line naming the ticker, the dates and
what to do.
`period` "train" starts each episode on a day drawn uniformly so that `episode_days` trading days follow it in the
training period (None: the whole period from its first day); "test" always plays the whole test period from its
first day (the backtest: cleanrl_utils/backtest.py). An episode starts with `initial_cash` (1e6) and no shares.

One step on trading day t (FinRL's, all prices being day t's close, trades executed in this order):
    a <- clip(action, -1, 1); a_i <- 0 where |a_i| < 0.1    (ElegantRL's dead zone: small actions trade nothing)
    k = trunc(a hmax)                      whole shares per stock, toward zero as FinRL's astype(int); hmax = 100
    turbulence_t >= turbulence_threshold:  sell every share held, buy nothing (FinRL's liquidation)
    sells (k_i < 0):  q = min(-k_i, h_i);  cash += p q (1 - cost);  h_i -= q          never below zero shares
    buys, largest k first (ties: lower index first):  q = min(k_i, floor(cash / (p (1 + cost))));
                      cash -= q p (1 + cost);  h_i += q
    reward = (value_{t+1} - value_t) * reward_scaling,  value = cash + sum_i h_i p_i    (reward_scaling 1e-4, cost 1e-3)
so cash never goes negative, shorting is impossible and the fees (cost x traded value) are inside the reward. No
episode terminates (nothing can go bankrupt); the last day of an episode is a truncation (the market goes on).

Observation at day t, float32, built from day-t data only (indicators and turbulence are causal: see stock_data):
    [cash / initial_cash, close * 0.01 (N), h * close / initial_cash (N), indicators * 0.01 (K x N, FinRL's order:
    all stocks' MACD, then all stocks' upper band ...)]
i.e. FinRL's state [cash, close, holdings, indicators] scaled to comparable magnitudes: cash and holdings as
fractions of the initial capital (holdings valued at the close), prices and indicators by one fixed 0.01 ($1-$500
-> 0.01-5; RSI, DX 0-100 -> 0-1; CCI about +-200 -> +-2). No statistic of the data enters the scaling. The action
space is Box(-1, 1, (N,)). Accounting is float64 throughout.

Where this differs from FinRL, on purpose: the turbulence of the current day is used from an episode's first step
(FinRL's is 0 until its first step); episodes end by truncation, with no extra no-op terminal step; buys tied in
size go in ticker order (FinRL's depends on np.argsort's order of ties). `record` (a path) makes the single env
write each finished episode's daily values, cash, holdings, fees and traded value as .npz (for the backtest).

StockTradingVecEnv (the vector_entry_point) holds cash [num_envs] and holdings [num_envs, N] in float64 on `device`
and steps all portfolios with the same batched ops (one function, `trade`, for NumPy and torch). Start days come
from one torch.Generator seeded by reset(seed=...). It autoresets in the same step (gymnasium's SAME_STEP): an
ended copy returns its fresh start in obs, its true last observation in infos["final_obs"] (always present, equal to
obs where nothing ended) with infos["_final_obs"]; infos["episode"] {"r", "l"} with infos["_episode"] as
RecordEpisodeStatistics gives them, and infos["portfolio_value"], all on the device.
"""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from cleanrl_utils.envs.stock_data import INDICATORS, MAX_CLOSED_DAYS, DataError, Market, leave_out, load_market

ENV_ID = "StockTrading-v0"
DEAD_ZONE = 0.1  # ElegantRL's: |action| below it trades nothing
SCALE = 0.01  # prices and indicators in the observation


@dataclasses.dataclass
class StockOptions:
    """The environment's options: gym.make keyword arguments, the scripts' --env-options JSON."""

    data: str = "default"
    """'default' (shipped in skfolio) or a CSV in FinRL's long format (date, tic, open, high, low, close, volume)"""
    tickers: tuple[str, ...] | None = None
    """the stocks traded (a list, or one comma-separated string); None: every ticker in the data"""
    train_start: str | None = "2009-01-01"
    """first day of the training period (None: the data's first day)"""
    test_start: str = "2020-01-01"
    """first day of the test period; the training period ends the day before"""
    test_end: str | None = None
    """end of the test period, excluded (None: through the data's last day)"""
    period: str = "train"
    """'train' (random start days) or 'test' (the whole test period from its first day)"""
    episode_days: int | None = 252
    """trading days in a training episode (None: the whole training period from its first day)"""
    hmax: int = 100
    """shares per stock that the action +-1 trades"""
    initial_cash: float = 1e6
    """the cash an episode starts with"""
    cost: float = 1e-3
    """transaction cost, a fraction of the traded value, on every buy and sell"""
    reward_scaling: float = 1e-4
    """reward = change in portfolio value times this"""
    turbulence_threshold: float | None = None
    """at or above it, sell everything and buy nothing (None: off)"""
    record: str | None = None
    """a .npz path the single env writes each finished episode's daily accounts to (for cleanrl_utils.backtest)"""

    def __post_init__(self):
        if isinstance(self.tickers, str):
            self.tickers = tuple(tic.strip() for tic in self.tickers.split(",") if tic.strip())
        self.tickers = tuple(self.tickers) if self.tickers else None

    def period_market(self) -> Market:
        """The data of the chosen period; DataError (one line) for any bad option."""
        if self.period not in ("train", "test"):
            raise DataError(f"period must be 'train' or 'test', got {self.period!r}")
        for name in ("hmax", "initial_cash"):
            if not getattr(self, name) > 0:
                raise DataError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.cost < 1:
            raise DataError(f"cost must be in [0, 1), got {self.cost}")
        if self.episode_days is not None and not (isinstance(self.episode_days, int) and self.episode_days > 0):
            raise DataError(f"episode_days must be a positive whole number or None, got {self.episode_days!r}")
        market = load_market(self.data, self.tickers)
        first, last = market.calendar[0], market.calendar[-1]
        bounds = {}
        for name in ("train_start", "test_start", "test_end"):
            value = getattr(self, name)
            if value is None:
                continue
            try:
                bounds[name] = np.datetime64(str(value), "D")
            except ValueError:
                raise DataError(f"{name} {value!r} is not a date (YYYY-MM-DD)") from None
        start, split = bounds.get("train_start", first), bounds.get("test_start", last + 1)
        end = bounds.get("test_end", last + 1)
        if start < first:
            raise DataError(f"train_start {start} is before the data's first day {first}")
        if split > last or end > last + 1:
            raise DataError(f"the test period [{split}, {end}) is outside the data, which ends on {last}")
        if not start < split < end:
            raise DataError(f"the dates must increase: train_start {start}, test_start {split}, test_end {end}")
        days = market.calendar[(market.calendar >= start) & (market.calendar < end)]  # both periods' trading days
        if not days.size:
            raise DataError(f"no trading day in [{start}, {end})")
        for tic, (listed, ended) in zip(market.tickers, market.spans):
            if listed > days[0]:
                raise DataError(
                    f"{tic} has rows from {listed} only, after the first day {days[0]} of the training period: "
                    f"start training on {listed} or later (train_start), {leave_out(tic, market.tickers)}"
                )
            if ended < days[-1]:
                raise DataError(
                    f"{tic} has rows until {ended} only, before the last day {days[-1]} of the test period: end the "
                    f"test by then (test_end {ended + 1}, test_start before it), {leave_out(tic, market.tickers)}"
                )
        closed = np.flatnonzero(np.diff(days) > np.timedelta64(MAX_CLOSED_DAYS, "D"))
        if closed.size:
            before, after = days[closed[0]], days[closed[0] + 1]
            raise DataError(
                f"no ticker has a row between {before} and {after} ({(after - before).astype(int)} days; no holiday "
                f"closes an exchange for over {MAX_CLOSED_DAYS}): add the days between, or keep the periods on one "
                f"side of it (train_start {after} or later, or test_end {before + 1} or earlier)"
            )
        chosen = market.between(*((start, split) if self.period == "train" else (split, end)))
        days = len(chosen.dates)
        needed = (self.episode_days or 1) + 1 if self.period == "train" else 2
        if days < needed:
            raise DataError(f"the {self.period} period has {days} trading days; an episode needs {needed}")
        return chosen


def order_shares(actions, hmax: int):
    """Actions [..., N] -> whole shares to trade (negative: sell): clipped to [-1, 1], the dead zone set to 0, scaled
    by hmax and truncated toward zero."""
    xp = torch if isinstance(actions, torch.Tensor) else np
    actions = xp.clip(actions, -1.0, 1.0)
    actions = xp.where(xp.abs(actions) < DEAD_ZONE, 0.0, actions)
    return xp.trunc(actions * hmax)


def trade(cash, holdings, price, shares, cost: float, liquidate):
    """One day's trades of a batch of portfolios: cash [B], holdings, price and wanted shares [B, N] (float64, whole
    numbers), liquidate [B] bool. Sells first, then buys from the largest down, each limited by the cash left after
    its fee. Returns (cash, holdings, fees [B], traded value [B]). One function for NumPy arrays and torch tensors."""
    xp = torch if isinstance(cash, torch.Tensor) else np
    shares = xp.where(liquidate[:, None], -holdings, shares)  # liquidation: sell everything ...
    sold = xp.minimum(xp.clip(-shares, 0.0, None), holdings)
    proceeds = (sold * price).sum(-1)
    cash, holdings = cash + proceeds * (1.0 - cost), holdings - sold
    fees, traded = proceeds * cost, proceeds
    wanted = xp.where(liquidate[:, None], 0.0, xp.clip(shares, 0.0, None))  # ... and buy nothing
    if xp is torch:
        rank = torch.argsort(wanted, dim=-1, descending=True, stable=True)
        take = torch.gather
    else:
        rank = np.argsort(-wanted, axis=-1, kind="stable")
        take = lambda values, axis, index: np.take_along_axis(values, index, axis)  # noqa: E731 (torch.gather's order)
    ranked_wanted, ranked_price = take(wanted, -1, rank), take(price, -1, rank)
    bought = []
    for j in range(holdings.shape[-1]):  # in sequence: each buy spends cash that the next one cannot
        p = ranked_price[:, j]
        unit = p * (1.0 + cost)
        affordable = xp.floor(cash / unit)
        affordable = xp.where(affordable * unit > cash, affordable - 1.0, affordable)  # the division rounded up
        q = xp.minimum(ranked_wanted[:, j], affordable)
        cash, fees, traded = cash - q * unit, fees + q * p * cost, traded + q * p
        bought.append(q)
    unrank = torch.argsort(rank, dim=-1) if xp is torch else np.argsort(rank, axis=-1)
    return cash, holdings + take(xp.stack(bought, -1), -1, unrank), fees, traded


def observe(cash, holdings, close, market_obs, initial_cash: float):
    """The float32 observation [B, 1 + 2N + KN] from cash [B], holdings [B, N], the day's closes [B, N] and its
    precomputed market part [B, N + KN] (closes and indicators scaled)."""
    xp = torch if isinstance(cash, torch.Tensor) else np
    n = holdings.shape[-1]
    parts = [cash[:, None] / initial_cash, market_obs[:, :n], holdings * close / initial_cash, market_obs[:, n:]]
    if xp is torch:
        return torch.cat([part.float() for part in parts], -1)
    return np.concatenate(parts, -1).astype(np.float32)


class _Portfolios:
    """What both envs share: the options, the period's arrays and the spaces."""

    def _setup(self, options: dict) -> None:
        self.options = StockOptions(**options)
        market = self.options.period_market()
        self.dates, self.tickers, self.prices = market.dates, market.tickers, market.close
        days, n = market.close.shape
        indicators = market.indicators.transpose(0, 2, 1).reshape(days, len(INDICATORS) * n)  # indicator-major
        self.market_obs = np.concatenate([market.close, indicators], -1) * SCALE
        threshold = self.options.turbulence_threshold
        self.liquidate = market.turbulence >= threshold if threshold is not None else np.zeros(days, bool)
        o = self.options
        self.hmax, self.cost, self.initial_cash, self.reward_scaling = o.hmax, o.cost, o.initial_cash, o.reward_scaling
        self.length = o.episode_days if o.period == "train" and o.episode_days else days - 1  # steps per episode
        self.last_start = days - 1 - self.length if o.period == "train" and o.episode_days else 0
        self.obs_dim = 1 + 2 * n + len(INDICATORS) * n
        self.space_pair = (
            gym.spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float32),
            gym.spaces.Box(-1.0, 1.0, (n,), np.float32),
        )


class StockTradingEnv(_Portfolios, gym.Env):
    """One portfolio, NumPy. Keyword arguments: StockOptions. reset(options={"start_day": d}) starts on day d of the
    period (an index) instead of a random one. info: portfolio_value (after the step), fees and traded value."""

    metadata = {"render_modes": []}

    def __init__(self, render_mode: str | None = None, **options):
        self._setup(options)
        self.observation_space, self.action_space = self.space_pair
        self.render_mode = render_mode
        self.cash, self.holdings = np.zeros(1), np.zeros((1, len(self.tickers)))
        self.day = self.start = 0
        self.history: dict[str, list] | None = None

    def _obs(self) -> np.ndarray:
        day = self.day
        return observe(self.cash, self.holdings, self.prices[day][None], self.market_obs[day][None], self.initial_cash)[
            0
        ]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "start_day" in options:
            self.start = int(options["start_day"])
            if not 0 <= self.start <= self.last_start:
                raise ValueError(f"start_day must be in [0, {self.last_start}] ({self.length} steps follow it)")
        else:
            self.start = int(self.np_random.integers(0, self.last_start + 1))
        self.day = self.start
        self.cash, self.holdings = np.full(1, float(self.initial_cash)), np.zeros((1, len(self.tickers)))
        self.history = (
            {key: [] for key in ("value", "cash", "holdings", "fees", "traded")} if self.options.record else None
        )
        return self._obs(), {}

    def step(self, action):
        shares = order_shares(np.asarray(action, np.float64).reshape(1, -1), self.hmax)
        price, day = self.prices[self.day][None], self.day
        value = self.cash + (self.holdings * price).sum(-1)
        if self.history is not None:
            self._remember(value)
        self.cash, self.holdings, fees, traded = trade(
            self.cash, self.holdings, price, shares, self.cost, self.liquidate[day : day + 1]
        )
        self.day += 1
        next_value = self.cash + (self.holdings * self.prices[self.day][None]).sum(-1)
        truncated = self.day - self.start >= self.length
        if self.history is not None:
            self.history["fees"].append(float(fees[0]))
            self.history["traded"].append(float(traded[0]))
            if truncated:  # the last day: its value, and no trade
                self._remember(next_value)
                self.history["fees"].append(0.0)
                self.history["traded"].append(0.0)
                self._write_record()
        info = {"portfolio_value": float(next_value[0]), "fees": float(fees[0]), "traded": float(traded[0])}
        return self._obs(), float((next_value - value)[0] * self.reward_scaling), False, truncated, info

    def _remember(self, value) -> None:
        """The day's accounts before its trades."""
        self.history["value"].append(float(value[0]))
        self.history["cash"].append(float(self.cash[0]))
        self.history["holdings"].append(self.holdings[0].copy())

    def _write_record(self) -> None:
        days = slice(self.start, self.day + 1)
        np.savez(
            self.options.record,
            dates=self.dates[days].astype(str),
            tickers=np.array(self.tickers),
            close=self.prices[days],
            **{key: np.array(values) for key, values in self.history.items()},
        )


class StockTradingVecEnv(_Portfolios, VectorEnv):
    """num_envs portfolios as tensors on `device`, SAME_STEP autoreset (see the module docstring). Keyword
    arguments: StockOptions. reset(options={"start_days": [num_envs]}) starts each copy on a given day."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int = 1, device: str | torch.device = "cpu", **options):
        self._setup(options)
        self.num_envs, self.device = num_envs, torch.device(device)
        self.single_observation_space, self.single_action_space = self.space_pair
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.prices_t = torch.as_tensor(self.prices, dtype=torch.float64, device=self.device)
        self.market_obs_t = torch.as_tensor(self.market_obs, dtype=torch.float32, device=self.device)
        self.liquidate_t = torch.as_tensor(self.liquidate, device=self.device)
        self.generator = torch.Generator(self.device)
        self.generator.seed()  # unseeded until reset(seed=...), as gymnasium's envs
        n = len(self.tickers)
        self.cash = torch.full((num_envs,), float(self.initial_cash), dtype=torch.float64, device=self.device)
        self.holdings = torch.zeros(num_envs, n, dtype=torch.float64, device=self.device)
        self.day = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.steps = torch.zeros_like(self.day)
        self.returns = torch.zeros(num_envs, dtype=torch.float64, device=self.device)

    def _start_days(self) -> torch.Tensor:
        return torch.randint(0, self.last_start + 1, (self.num_envs,), generator=self.generator, device=self.device)

    def _obs(self) -> torch.Tensor:
        return observe(
            self.cash, self.holdings, self.prices_t[self.day], self.market_obs_t[self.day], self.initial_cash
        )

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.generator.manual_seed(seed)
        if options and "start_days" in options:
            self.day = torch.as_tensor(options["start_days"], dtype=torch.int64, device=self.device).clone()
            if self.day.shape != (self.num_envs,) or not bool(((self.day >= 0) & (self.day <= self.last_start)).all()):
                raise ValueError(f"start_days must be {self.num_envs} days in [0, {self.last_start}]")
        else:
            self.day = self._start_days()
        self.cash.fill_(float(self.initial_cash))
        self.holdings.zero_()
        self.steps.zero_()
        self.returns.zero_()
        return self._obs(), {}

    def step(self, actions):
        actions = torch.as_tensor(actions, device=self.device).to(torch.float64).reshape(self.holdings.shape)
        price = self.prices_t[self.day]
        value = self.cash + (self.holdings * price).sum(-1)
        shares = order_shares(actions, self.hmax)
        cash, holdings, _, _ = trade(self.cash, self.holdings, price, shares, self.cost, self.liquidate_t[self.day])
        day, steps = self.day + 1, self.steps + 1
        next_value = cash + (holdings * self.prices_t[day]).sum(-1)
        rewards = (next_value - value) * self.reward_scaling
        returns = self.returns + rewards
        truncations = steps >= self.length
        terminations = torch.zeros_like(truncations)
        self.cash, self.holdings, self.day = cash, holdings, day
        final_obs = self._obs()
        # Every copy draws a start day each step and the ended ones take it: batched, no host read of `truncations`.
        self.day = torch.where(truncations, self._start_days(), day)
        self.cash = torch.where(truncations, float(self.initial_cash), cash)
        self.holdings = holdings.masked_fill(truncations[:, None], 0.0)
        self.steps, self.returns = steps.masked_fill(truncations, 0), returns.masked_fill(truncations, 0.0)
        infos = {
            "final_obs": final_obs,
            "_final_obs": truncations,
            "episode": {"r": returns.float(), "l": steps},
            "_episode": truncations,
            "portfolio_value": next_value,
        }
        return self._obs(), rewards.float(), terminations, truncations, infos


def configure(env_id: str, env_options: str | dict | None) -> None:
    """For the scripts' --env-options (a JSON object of StockOptions): check the options, then make them env_id's
    registered keyword arguments, so that every later gym.make(env_id) in this process (the script's envs, its
    evaluation) trades that market. Bad options stop with one line on stderr (exit 2). None leaves the id as it is."""
    from cleanrl_utils.errors import fail

    if env_options is None or env_id not in gym.registry:  # an unknown id: check_env_id names the nearest
        return
    try:
        options = json.loads(env_options) if isinstance(env_options, str) else dict(env_options)
    except json.JSONDecodeError as error:
        fail(f'--env-options is not JSON ({error}): give an object such as \'{{"tickers": ["AAPL", "MSFT"]}}\'')
    if not isinstance(options, dict):
        fail(f"--env-options must be a JSON object of {env_id}'s options, got {env_options!r}")
    known = [field.name for field in dataclasses.fields(StockOptions)]
    unknown = [name for name in options if name not in known]
    if unknown:
        fail(f"--env-options: unknown option {unknown[0]!r} for {env_id} (known: {', '.join(known)})")
    try:
        StockOptions(**options).period_market()
    except DataError as error:
        fail(f"--env-options for {env_id}: {error}")
    gym.registry[env_id] = dataclasses.replace(gym.spec(env_id), kwargs=options)  # no re-registration warning


if ENV_ID not in gym.registry:
    gym.register(
        ENV_ID,
        entry_point="cleanrl_utils.envs.stock_trading:StockTradingEnv",
        vector_entry_point="cleanrl_utils.envs.stock_trading:StockTradingVecEnv",
    )
