"""StockTrading-v0 (cleanrl_utils/envs/stock_trading.py, stock_data.py): trades against hand computations (costs,
sells before buys, cash-limited buys, the dead zone), value conserved without costs, no negative cash or holdings
whatever the action, turbulence (FinRL's formula) and liquidation, no look-ahead, the batched env against single envs,
the data loaders and their bad input (each bad file made from a good one: a date missing for one ticker, NaN highs,
an unadjusted split, dd/mm/yyyy dates, a duplicate row, a short or late ticker ... refused in one line naming the
ticker and the dates), and the continuous scripts taking the id with --env-options."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import pickle
import sys
import types

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import assert_bad_input, run_script

from cleanrl_utils.envs import stock_data
from cleanrl_utils.envs.stock_data import INDICATORS, DataError, load_market, turbulence
from cleanrl_utils.envs.stock_trading import (
    ENV_ID,
    StockOptions,
    StockTradingEnv,
    StockTradingVecEnv,
    configure,
    order_shares,
    trade,
)

CONTINUOUS = [
    "ppo_continuous_action.py",
    "sac_continuous_action.py",
    "td3_continuous_action.py",
    "ddpg_continuous_action.py",
    "redq_continuous_action.py",
]


def write_prices(path, tickers=("AAA", "BBB", "CCC"), days=400, start="2018-01-01", seed=0, scale=None):
    """A made-up FinRL long-format CSV: geometric random walks over business days, highs and lows around them.
    `scale(day_index, prices)` may change the closes (the no-look-ahead test)."""
    rng = np.random.default_rng(seed)
    dates = pd.bdate_range(start, periods=days)
    close = 50.0 * np.exp(np.cumsum(rng.normal(0.0, 0.02, (days, len(tickers))), 0)) * np.arange(1, len(tickers) + 1)
    if scale is not None:
        close = scale(np.arange(days)[:, None], close)
    rows = []
    for t, date in enumerate(dates):
        for i, tic in enumerate(tickers):
            c = close[t, i]
            rows.append((date.strftime("%Y-%m-%d"), tic, c * 0.995, c * 1.01, c * 0.985, c, 1e6 + 1e3 * t))
    pd.DataFrame(rows, columns=list(stock_data.FINRL_COLUMNS)).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def prices(tmp_path_factory):
    return str(write_prices(tmp_path_factory.mktemp("data") / "prices.csv"))


def options(prices, **extra):
    """Options over the made-up data: training 2018-01-01 .. 2018-12-31 (261 days), test from 2019-01-01 (139)."""
    return {"data": prices, "train_start": "2018-01-01", "test_start": "2019-01-01", **extra}


def batch(*rows):
    return [np.array(row, np.float64) for row in rows]


# --- the trades against hand computations ---------------------------------------------------------


def test_costs_are_charged_exactly_and_sells_come_before_buys():
    # cash 10000, holdings [10, 0, 5] at prices [100, 50, 20]; sell 4, buy 30, buy 100; cost 0.1%.
    cash, holdings, price, shares = batch([10_000.0], [[10, 0, 5]], [[100.0, 50.0, 20.0]], [[-4, 30, 100]])
    cash, holdings, fees, traded = trade(cash, holdings, price, shares, 0.001, np.array([False]))
    # the sale: 400 * 0.999 = 399.6 in; the larger buy first: 100 * 20 * 1.001 = 2002; then 30 * 50 * 1.001 = 1501.5
    assert cash[0] == pytest.approx(10_000 + 399.6 - 2002 - 1501.5, abs=1e-9)
    assert holdings.tolist() == [[6, 30, 105]]
    assert fees[0] == pytest.approx(0.4 + 2.0 + 1.5, abs=1e-12) and traded[0] == pytest.approx(3900.0)
    # No cash at all: the sale pays for the buy (sells first), cost 0.1% each way.
    cash, holdings, fees, _ = trade(*batch([0.0], [[10, 0]], [[10.0, 10.0]], [[-10, 5]]), 0.001, np.array([False]))
    assert holdings.tolist() == [[0, 5]] and cash[0] == pytest.approx(99.9 - 50.05, abs=1e-12)
    assert fees[0] == pytest.approx(0.1 + 0.05, abs=1e-12)


def test_buys_are_limited_by_cash_after_costs_largest_first():
    # 1000 cash, 50 of each wanted at 30 and 7: ties go in ticker order: floor(1000 / 30.03) = 33, then
    # floor((1000 - 33 * 30.03) / 7.007) = 1.
    cash, holdings, _, _ = trade(*batch([1000.0], [[0, 0]], [[30.0, 7.0]], [[50, 50]]), 0.001, np.array([False]))
    assert holdings.tolist() == [[33, 1]] and cash[0] == pytest.approx(1000 - 33 * 30.03 - 7.007, abs=1e-9)
    # the larger order first: 50 * 7.007 = 350.35, then floor(649.65 / 30.03) = 21 of the 30 wanted
    cash, holdings, _, _ = trade(*batch([1000.0], [[0, 0]], [[30.0, 7.0]], [[30, 50]]), 0.001, np.array([False]))
    assert holdings.tolist() == [[21, 50]] and cash[0] == pytest.approx(1000 - 350.35 - 21 * 30.03, abs=1e-9)
    # at the edge: 1 share at 99.9 with 0.1% costs 99.9999 of the 100 there is
    cash, holdings, _, _ = trade(*batch([100.0], [[0]], [[99.9]], [[5]]), 0.001, np.array([False]))
    assert holdings.tolist() == [[1]] and 0 <= cash[0] == pytest.approx(0.0001, abs=1e-12)


def test_action_scaling_and_the_dead_zone():
    actions = np.array([[0.099, -0.099, 0.1, -0.5, 0.019, 1.7, -3.0, 0.555, -0.999]], np.float32)
    expected = [[0, 0, 10, -50, 0, 100, -100, 55, -99]]  # clipped to [-1, 1], |a| < 0.1 -> 0, x 100, toward zero
    assert order_shares(actions.astype(np.float64), 100).tolist() == expected
    assert order_shares(torch.from_numpy(actions).double(), 100).tolist() == expected


@pytest.mark.parametrize("xp", ["numpy", "torch"])
def test_without_costs_every_trade_conserves_value(xp):
    rng = np.random.default_rng(1)
    cash = rng.uniform(0, 5e4, 512)
    holdings = rng.integers(0, 300, (512, 6)).astype(np.float64)
    price = rng.uniform(1.0, 400.0, (512, 6))
    shares = rng.integers(-300, 300, (512, 6)).astype(np.float64)
    liquidate = rng.random(512) < 0.1
    args = (cash, holdings, price, shares)
    if xp == "torch":
        args, liquidate = [torch.from_numpy(a) for a in args], torch.from_numpy(liquidate)
    new_cash, new_holdings, fees, _ = trade(*args, 0.0, liquidate)
    before, after = cash + (holdings * price).sum(-1), np.asarray(new_cash) + (np.asarray(new_holdings) * price).sum(-1)
    np.testing.assert_allclose(after, before, rtol=1e-12)
    assert (np.asarray(fees) == 0).all() and (np.asarray(new_holdings) != holdings).any()


# --- the environment: rewards, invariants, turbulence ---------------------------------------------


def test_rewards_and_observations_match_a_hand_computation(prices):
    env = StockTradingEnv(**options(prices, period="test"))
    market = load_market(prices).between(np.datetime64("2019-01-01"), np.datetime64("2100-01-01"))
    p = market.close
    obs, _ = env.reset(seed=0)
    assert obs.shape == (1 + 2 * 3 + 8 * 3,) and obs.dtype == np.float32
    np.testing.assert_allclose(obs[:7], [1.0, *(p[0] * 0.01), 0, 0, 0], rtol=1e-6)
    tech = market.indicators[0].T.reshape(-1) * 0.01  # indicator-major: every stock's MACD, then ...
    np.testing.assert_allclose(obs[7:], tech, rtol=1e-6)
    # day 0: buy 50, 25 and (dead zone) nothing
    obs, reward, terminated, truncated, info = env.step(np.array([0.5, 0.25, 0.05], np.float32))
    cash = 1e6 - (50 * p[0, 0] + 25 * p[0, 1]) * 1.001
    value = cash + 50 * p[1, 0] + 25 * p[1, 1]
    assert reward == pytest.approx((value - 1e6) * 1e-4, rel=1e-9) and not terminated and not truncated
    assert info["portfolio_value"] == pytest.approx(value) and info["fees"] == pytest.approx(
        0.001 * (50 * p[0, 0] + 25 * p[0, 1])
    )
    np.testing.assert_allclose(obs[:7], [cash / 1e6, *(p[1] * 0.01), 50 * p[1, 0] / 1e6, 25 * p[1, 1] / 1e6, 0], 1e-6)
    # day 1: sell 30 of the first, try to sell the third (none held), a dead buy
    _, reward, _, _, _ = env.step(np.array([-0.3, 0.09, -1.0], np.float32))
    cash2 = cash + 30 * p[1, 0] * 0.999
    value2 = cash2 + 20 * p[2, 0] + 25 * p[2, 1]
    assert reward == pytest.approx((value2 - value) * 1e-4, rel=1e-9)
    assert env.holdings.tolist() == [[20, 25, 0]]
    for _ in range(len(p) - 4):
        *_, truncated, _ = env.step(np.zeros(3, np.float32))
        assert not truncated
    *_, truncated, _ = env.step(np.zeros(3, np.float32))
    assert truncated and env.day == len(p) - 1, "the test period is one episode, to its last day"


def test_cash_and_holdings_never_go_negative_whatever_the_action(prices):
    env = StockTradingEnv(**options(prices, episode_days=None, cost=0.01, hmax=10_000))
    env.reset(seed=0)
    rng = np.random.default_rng(2)
    for _ in range(260):
        env.step(rng.uniform(-3, 3, 3).astype(np.float32) * rng.choice([0.05, 1.0, 50.0]))
        assert env.cash[0] >= 0 and (env.holdings >= 0).all() and (env.holdings == np.round(env.holdings)).all()
    assert env.holdings.sum() > 0 and env.cash[0] < 1e5, "the big orders spent the cash (the test bites)"
    envs = StockTradingVecEnv(num_envs=64, **options(prices, episode_days=30, cost=0.01, hmax=10_000))
    envs.reset(seed=0)
    generator = torch.Generator().manual_seed(3)
    for _ in range(100):
        envs.step((torch.rand(64, 3, generator=generator) * 6 - 3) * 20)
        assert (envs.cash >= 0).all() and (envs.holdings >= 0).all() and (envs.holdings == envs.holdings.round()).all()


def finrl_turbulence(close: np.ndarray) -> np.ndarray:
    """FinRL's calculate_turbulence written out with pandas (its pivot, pct_change, window and pinv)."""
    frame = pd.DataFrame(close).pct_change()
    values, count = [0.0] * 252, 0
    for i in range(252, len(frame)):
        history = frame.iloc[i - 252 : i]
        history = history.iloc[history.isna().sum().min() :].dropna(axis=1)
        current = frame.iloc[[i]][list(history)] - np.mean(history, axis=0)
        temp = current.values.dot(np.linalg.pinv(history.cov())).dot(current.values.T)
        count += bool(temp > 0)
        values.append(float(temp[0][0]) if temp > 0 and count > 2 else 0.0)
    return np.array(values)


def test_turbulence_is_finrls_and_liquidates(prices):
    close = load_market(prices).close
    np.testing.assert_allclose(turbulence(close), finrl_turbulence(close), rtol=1e-9, atol=1e-9)
    market = load_market(prices)
    threshold = float(np.quantile(market.turbulence[254:], 0.8))
    env = StockTradingEnv(**options(prices, test_start="2019-07-01", episode_days=5, turbulence_threshold=threshold))
    assert env.liquidate.any()
    np.testing.assert_array_equal(env.liquidate, market.turbulence[: len(env.liquidate)] >= threshold)
    day = next(d for d in range(3, env.last_start) if env.liquidate[d] and not env.liquidate[d - 3 : d].any())
    env.reset(seed=0, options={"start_day": day - 3})
    buy = np.ones(3, np.float32)
    for _ in range(3):
        env.step(buy)  # calm days: 100 of each bought
    assert env.holdings.tolist() == [[300, 300, 300]] and env.day == day
    cash, price = env.cash[0], env.prices[day]
    _, _, _, _, info = env.step(buy)  # turbulent: everything sold at the close, the buy refused
    assert env.holdings.tolist() == [[0, 0, 0]]
    assert env.cash[0] == pytest.approx(cash + 300 * price.sum() * 0.999, rel=1e-12)
    assert info["fees"] == pytest.approx(300 * price.sum() * 0.001)


# --- causality and the batched env ----------------------------------------------------------------


def test_no_look_ahead_later_prices_change_nothing_before_them(tmp_path, prices):
    cut = 150  # day 150 onwards differs: a crash and noise
    changed = write_prices(tmp_path / "changed.csv", scale=lambda t, c: np.where(t >= cut, c * (0.5 + (t % 7) / 7), c))
    a, b = load_market(prices), load_market(str(changed))
    np.testing.assert_array_equal(a.dates, b.dates)
    for field in ("close", "indicators", "turbulence"):
        np.testing.assert_array_equal(getattr(a, field)[:cut], getattr(b, field)[:cut], err_msg=field)
        assert not np.array_equal(getattr(a, field)[cut:], getattr(b, field)[cut:]), f"{field} should change"
    envs = [StockTradingEnv(**options(data, episode_days=None)) for data in (prices, str(changed))]
    observations = [env.reset(seed=0)[0] for env in envs]
    rng = np.random.default_rng(4)
    for day in range(1, cut + 5):
        action = rng.uniform(-1, 1, 3).astype(np.float32)
        steps = [env.step(action) for env in envs]
        same = day < cut
        assert np.array_equal(steps[0][0], steps[1][0]) == same, f"observation of day {day}"
        assert (steps[0][1] == steps[1][1]) == same, f"reward of the step to day {day}"
    assert np.array_equal(observations[0], observations[1])


def test_batched_env_equals_single_envs_stepped_alike(prices):
    n, length = 5, 20
    opts = options(prices, episode_days=length)
    batched = StockTradingVecEnv(num_envs=n, **opts)
    singles = [StockTradingEnv(**opts) for _ in range(n)]
    starts = iter([[0, 7, 100, 200, 240], [3, 50, 120, 0, 1], [9, 9, 9, 9, 9], [0] * n])  # the next start of each copy
    batched._start_days = lambda: torch.tensor(upcoming)
    upcoming = next(starts)
    obs_b, _ = batched.reset(options={"start_days": upcoming})
    obs_s = np.stack([env.reset(options={"start_day": d})[0] for env, d in zip(singles, upcoming)])
    np.testing.assert_array_equal(obs_b.numpy(), obs_s)
    upcoming = next(starts)
    rng = np.random.default_rng(5)
    returns = np.zeros(n)
    for step in range(1, 2 * length + 1):
        actions = rng.uniform(-1.2, 1.2, (n, 3)).astype(np.float32)
        obs_b, rew_b, term_b, trunc_b, info_b = batched.step(torch.from_numpy(actions))
        results = [env.step(a) for env, a in zip(singles, actions)]
        rew_s = np.array([r[1] for r in results])
        returns += rew_s
        np.testing.assert_allclose(rew_b.numpy(), rew_s, rtol=1e-6, atol=1e-7)
        assert not term_b.any() and trunc_b.tolist() == [r[3] for r in results] == [step % length == 0] * n
        np.testing.assert_allclose(info_b["portfolio_value"].numpy(), [r[4]["portfolio_value"] for r in results])
        final = np.stack([r[0] for r in results])
        np.testing.assert_allclose(info_b["final_obs"].numpy(), final, rtol=1e-6, atol=1e-7)
        if step % length == 0:  # SAME_STEP: the fresh start in obs, the episode's statistics
            np.testing.assert_allclose(info_b["episode"]["r"].numpy(), returns, rtol=1e-5)
            assert info_b["episode"]["l"].tolist() == [length] * n and info_b["_episode"].all()
            obs_s = np.stack([env.reset(options={"start_day": d})[0] for env, d in zip(singles, upcoming)])
            assert batched.day.tolist() == upcoming and (batched.holdings == 0).all()
            upcoming, returns = next(starts), np.zeros(n)
        else:
            obs_s = final
            assert torch.equal(info_b["final_obs"], obs_b)
        np.testing.assert_allclose(obs_b.numpy(), obs_s, rtol=1e-6, atol=1e-7)
        assert torch.equal(batched.holdings, torch.from_numpy(np.concatenate([env.holdings for env in singles])))
        np.testing.assert_allclose(batched.cash.numpy(), np.concatenate([env.cash for env in singles]), rtol=1e-12)


def test_random_starts_seeding_and_pickling(prices):
    env = StockTradingEnv(**options(prices, episode_days=100))
    starts = set()
    for seed in range(40):
        env.reset(seed=seed)
        starts.add(env.start)
    assert len(starts) > 20 and min(starts) >= 0 and max(starts) <= 261 - 1 - 100
    env.reset(seed=3)
    start = env.start
    env.reset(seed=3)
    assert env.start == start
    env.step(np.full(3, 0.7, np.float32))
    copy = pickle.loads(pickle.dumps(env))  # the scripts' checkpoints pickle the envs
    for _ in range(5):
        action = np.array([0.5, -0.2, 0.9], np.float32)
        np.testing.assert_array_equal(env.step(action)[0], copy.step(action)[0])
    a, b = (StockTradingVecEnv(num_envs=16, **options(prices)) for _ in range(2))
    assert torch.equal(a.reset(seed=7)[0], b.reset(seed=7)[0]) and not torch.equal(
        a.reset(seed=8)[0], b.reset(seed=7)[0]
    )


def test_a_checkpoint_snapshot_of_the_scripts_envs_continues_exactly(prices):
    """What --checkpoint-every saves: the SyncVectorEnv the scripts step, pickled with each portfolio mid-episode."""
    import sac_continuous_action as sac

    from cleanrl_utils.checkpoint import restore_envs, snapshot_envs

    spec = gym.spec(ENV_ID)
    try:
        sac.register_env_family(ENV_ID, json.dumps(options(prices, episode_days=10)))
        envs = sac.make_envs(ENV_ID, 2)
        obs, _ = envs.reset(seed=1)
        rng = np.random.default_rng(6)
        for _ in range(7):
            obs, *_ = envs.step(rng.uniform(-1, 1, (2, 3)).astype(np.float32))
        snapshot = snapshot_envs(envs, obs)
        assert snapshot is not None
        restored, restored_obs = restore_envs(sac.make_envs(ENV_ID, 2), snapshot, None)
        np.testing.assert_array_equal(restored_obs, obs)
        for _ in range(12):  # across the end of the episodes: the fresh start days come from the pickled RNGs
            actions = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
            for a, b in zip(envs.step(actions), restored.step(actions)):
                if isinstance(a, np.ndarray):
                    np.testing.assert_array_equal(a, b)
    finally:
        gym.registry[ENV_ID] = spec


def test_registered_id_the_vector_entry_point_and_configure(prices):
    env = gym.make(ENV_ID, **options(prices, tickers=["CCC", "AAA"]))
    assert env.observation_space.shape == (1 + 4 + 16,) and env.action_space == gym.spaces.Box(-1, 1, (2,), np.float32)
    assert env.unwrapped.tickers == ("CCC", "AAA")
    envs = gym.make_vec(ENV_ID, num_envs=3, vectorization_mode="vector_entry_point", device="cpu", **options(prices))
    assert (
        isinstance(envs, StockTradingVecEnv) and envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    )
    obs, _ = envs.reset(seed=0)
    obs, rewards, terminations, truncations, _ = envs.step(envs.action_space.sample())
    assert obs.shape == (3, 31) and obs.dtype == rewards.dtype == torch.float32 and truncations.dtype == torch.bool
    spec = gym.spec(ENV_ID)
    try:
        configure(ENV_ID, json.dumps(options(prices, tickers="BBB,AAA")))
        assert gym.make(ENV_ID).unwrapped.tickers == ("BBB", "AAA"), "the options became the id's kwargs"
        configure(ENV_ID, None)
        assert gym.make(ENV_ID).unwrapped.tickers == ("BBB", "AAA"), "None keeps them"
    finally:
        gym.registry[ENV_ID] = spec


def test_indicators_are_finrls_stockstats_columns(prices):
    market = load_market(prices)
    frame = pd.read_csv(prices)
    close = frame[frame.tic == "BBB"]["close"].reset_index(drop=True)
    column = market.indicators[:, 1]
    np.testing.assert_allclose(column[:, INDICATORS.index("close_30_sma")], close.rolling(30, min_periods=1).mean())
    macd = close.ewm(span=12, adjust=True).mean() - close.ewm(span=26, adjust=True).mean()
    np.testing.assert_allclose(column[:, INDICATORS.index("macd")], macd, rtol=1e-9, atol=1e-12)
    upper = close.rolling(20, min_periods=1).mean() + 2 * close.rolling(20, min_periods=1).std()
    np.testing.assert_allclose(column[1:, INDICATORS.index("boll_ub")], upper[1:], rtol=1e-9)
    for name in ("rsi_30", "dx_30"):
        assert (column[:, INDICATORS.index(name)] >= 0).all() and (column[:, INDICATORS.index(name)] <= 100).all()
    assert np.isfinite(market.indicators).all()


def test_default_data_ships_offline():
    if importlib.util.find_spec("skfolio") is None:
        pytest.skip("the default data ships in skfolio (the stocks extra)")
    market = load_market("default", ("AAPL", "XOM"))
    assert market.tickers == ("AAPL", "XOM") and len(market.dates) == 8313
    assert str(market.dates[0]) == "1990-01-02" and str(market.dates[-1]) == "2022-12-28"
    # The data's checks change nothing in what is loaded: the figures the loader gave before them.
    loaded = hashlib.sha256(market.dates.astype(np.int64).tobytes() + market.close.tobytes()).hexdigest()
    assert loaded == "2c13351dd184ffd2faad4db1bde547c5a72f566dc51ea2118406a69cb854c504"
    np.testing.assert_allclose(
        market.indicators[-1, 1, :4],
        [-0.0383080582664661, 109.879601710257, 100.396498289743, 53.2877782340616],
        rtol=1e-9,
    )
    assert market.turbulence.sum() == pytest.approx(17702.978701921416, rel=1e-9)
    assert StockOptions(tickers=("AAPL", "XOM")).period_market().dates[0] == np.datetime64("2009-01-02")
    # ... and every one of its 20 stocks passes them (RRC's stale 1990 quote moves 3.001x in a day, not a split).
    frame = stock_data.default_prices().sort_values(["tic", "date"], kind="stable")
    tickers = tuple(sorted(frame["tic"].unique()))
    assert len(tickers) == 20
    stock_data.check_prices(frame, tickers, "the default data")


def test_yfinance_download_becomes_finrls_long_format(monkeypatch, tmp_path):
    """The reshaping, with a stand-in for yfinance (the real one is online and never called in tests)."""

    class Ticker:
        def __init__(self, tic):
            self.tic = tic

        def history(self, start, end, interval, auto_adjust):
            assert auto_adjust and interval == "1d"
            index = pd.DatetimeIndex(["2020-01-02", "2020-01-03"], name="Date", tz="America/New_York")
            frame = {key: [1.0, 2.0] for key in ("Open", "High", "Low", "Close", "Volume", "Dividends")}
            return pd.DataFrame(frame, index=index)

    monkeypatch.setitem(sys.modules, "yfinance", types.SimpleNamespace(Ticker=Ticker))
    frame = stock_data.download(["MSFT", "AAPL"], "2020-01-01", "2020-01-04")
    assert list(frame.columns) == list(stock_data.FINRL_COLUMNS) and len(frame) == 4
    assert frame[["date", "tic"]].values.tolist()[:2] == [["2020-01-02", "AAPL"], ["2020-01-02", "MSFT"]]
    frame.to_csv(tmp_path / "downloaded.csv", index=False)
    assert len(stock_data.read_csv(tmp_path / "downloaded.csv")) == 4


# --- bad input: one line naming the problem ------------------------------------------------------


def bad_csv(tmp_path, kind, prices):
    """The good made-up file `prices` (write_prices: AAA, BBB, CCC over 400 business days from 2018-01-01, dated
    YYYY-MM-DD, one row per day and ticker in date order) spoiled one way: `kind` says how."""
    frame = pd.read_csv(prices)
    day = pd.to_datetime(frame["date"]).rank(method="dense").astype(int) - 1  # 0 .. 399
    bbb, ccc = frame["tic"] == "BBB", frame["tic"] == "CCC"
    if kind == "columns":
        frame = frame.drop(columns=["high", "volume"])
    elif kind == "dates":  # a date of BBB out of order
        rows = frame.index[bbb]
        frame.loc[rows[10], "date"], frame.loc[rows[11], "date"] = (
            frame.loc[rows[11], "date"],
            frame.loc[rows[10], "date"],
        )
    elif kind == "missing date":  # day 40, 2018-02-26
        frame = frame[~(bbb & (day == 40))]
    elif kind == "60 missing days":  # days 100 .. 159, 2018-05-21 .. 2018-08-10
        frame = frame[~(bbb & day.between(100, 159))]
    elif kind.startswith("nan "):  # day 50, 2018-03-12: an empty field
        frame.loc[bbb & (day == 50), kind.removeprefix("nan ")] = np.nan
    elif kind.startswith("unadjusted split"):  # 10:1 on day 200, 2018-10-08: earlier prices x10, volumes / 10
        before = bbb & (day < 200)
        frame.loc[before, ["open", "high", "low", "close"]] *= 10.0
        frame.loc[before, "volume"] /= 10.0
        if kind.endswith("closes only"):  # as the default data: open = high = low = close, volume 0
            frame[["open", "high", "low"]] = frame[["close"] * 3].to_numpy()
            frame["volume"] = 0.0
    elif kind == "dd/mm/yyyy":
        frame["date"] = pd.to_datetime(frame["date"]).dt.strftime("%d/%m/%Y")
    elif kind == "duplicated row":  # BBB's row of day 10, 2018-01-15 (line 33), twice
        frame = pd.concat([frame, frame[bbb & (day == 10)]]).sort_index(kind="stable")
    elif kind == "short ticker":  # CCC's first 100 days only, to 2018-05-18
        frame = frame[~(ccc & (day >= 100))]
    elif kind == "late-listed ticker":  # CCC from day 200, 2018-10-08
        frame = frame[~(ccc & (day < 200))]
    elif kind == "market closed":  # days 100 .. 159 of every ticker
        frame = frame[~day.between(100, 159)]
    path = tmp_path / f"{kind.replace('/', '-')}.csv"
    frame.to_csv(path, index=False)
    return str(path)


LEAVE_BBB_OUT = 'or leave BBB out ("tickers": ["AAA", "CCC"])'


@pytest.mark.parametrize(
    "case, fragments",
    [
        ({"tickers": ["AAA", "BBX"]}, ["unknown ticker 'BBX'", "BBB"]),
        (
            {"test_end": "2030-01-01"},
            ["test period [2019-01-01, 2030-01-01) is outside the data", "ends on 2019-07-12"],
        ),
        ({"test_start": "2020-06-01"}, ["test period", "outside the data"]),
        ({"train_start": "2017-01-01"}, ["train_start 2017-01-01 is before the data's first day 2018-01-01"]),
        ({"period": "validation"}, ["period must be 'train' or 'test'"]),
        ({"episode_days": 400}, ["the train period has 261 trading days; an episode needs 401"]),
        ({"tiker": "AAA"}, ["unknown option 'tiker'", "tickers"]),
        ("columns", ["missing columns high, volume", "date, tic, open, high, low, close, volume"]),
        ("dates", ["dates of BBB do not increase at line 36", "2018-01-15 after 2018-01-16"]),
        ("not json", ["--env-options is not JSON"]),
        # Data that the old loader took (or refused without naming the ticker or the dates):
        ("60 missing days", ["BBB has no row for 60 dates from 2018-05-21 to 2018-08-10, which AAA, CCC trade"]),
        ("nan high", ["BBB has a high that is missing or not positive (nan) on 2018-03-12", "fill in its highs"]),
        ("nan low", ["BBB has a low that is missing or not positive (nan) on 2018-03-12", LEAVE_BBB_OUT]),
        ("nan volume", ["BBB has a volume that is missing or negative (nan) on 2018-03-12", LEAVE_BBB_OUT]),
        (
            "unadjusted split",
            ["BBB's close goes from", "on 2018-10-05 to", "on 2018-10-08", "median volume x", "unadjusted 10:1 split"],
        ),
        ("unadjusted split, closes only", ["on 2018-10-08", "20-day median close x0.", "unadjusted 10:1 split"]),
        ("dd/mm/yyyy", ["line 2 (AAA) has the date '01/01/2018'", "dd/mm/yyyy or mm/dd/yyyy", "as YYYY-MM-DD"]),
        ("duplicated row", ["BBB has 2 rows for 2018-01-15, lines 33, 34 (identical)", "keep one row per ticker"]),
        (
            "short ticker",
            ["CCC has rows until 2018-05-18 only, before the last day 2019-07-12", "test_end 2018-05-19", "leave CCC"],
        ),
        (
            "late-listed ticker",
            ["CCC has rows from 2018-10-08 only, after the first day 2018-01-01", 'out ("tickers": ["AAA", "BBB"])'],
        ),
        ("market closed", ["no ticker has a row between 2018-05-18 and 2018-08-13 (87 days", "train_start 2018-08-13"]),
    ],
)
def test_bad_options_stop_in_one_line(case, fragments, prices, tmp_path, capsys):
    if isinstance(case, str) and case != "not json":
        text = json.dumps(options(bad_csv(tmp_path, case, prices)))
    else:
        text = case if isinstance(case, str) else json.dumps(options(prices, **case))
    spec = gym.spec(ENV_ID)
    with pytest.raises(SystemExit) as stopped:
        configure(ENV_ID, text)
    assert stopped.value.code == 2 and gym.spec(ENV_ID) == spec, "nothing registered"
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_a_script_stops_on_a_date_missing_for_one_ticker(workdir, prices, tmp_path):
    """Through the command a user runs: the old loader dropped 2018-02-26 for every ticker and trained on."""
    flags = ["--env-id", ENV_ID, "--env-options", json.dumps(options(bad_csv(tmp_path, "missing date", prices)))]
    flags += ["--total-timesteps", "64", "--num-steps", "32", "--num-minibatches", "1", "--update-epochs", "1"]
    result = run_script("ppo_continuous_action.py", *flags, cwd=workdir)
    assert result.returncode == 2, result.stderr[-2000:]
    assert_bad_input(
        result,
        workdir,
        "--env-options for StockTrading-v0",
        "BBB has no row for 2018-02-26, which AAA, CCC trade",
        "add BBB's rows for them",
        LEAVE_BBB_OUT,
    )


def test_the_library_raises_a_value_error(prices):
    with pytest.raises(DataError, match="unknown ticker 'ZZZ'"):
        StockTradingEnv(**options(prices, tickers=["ZZZ"]))
    with pytest.raises(ValueError, match="start_day must be in"):
        StockTradingEnv(**options(prices)).reset(options={"start_day": 250})
    assert StockOptions(tickers=" A, B ,").tickers == ("A", "B")


# --- the continuous scripts take the id -----------------------------------------------------------


@pytest.mark.parametrize("script", CONTINUOUS)
def test_continuous_scripts_register_the_id_with_its_options(script, monkeypatch, prices):
    module = importlib.import_module(script.removesuffix(".py"))
    monkeypatch.delitem(gym.registry, ENV_ID)
    monkeypatch.delitem(sys.modules, "cleanrl_utils.envs.stock_trading")
    module.register_env_family("Pendulum-v1")
    assert ENV_ID not in gym.registry
    module.register_env_family(ENV_ID, json.dumps(options(prices, tickers=["AAA"])))
    assert gym.make(ENV_ID).action_space.shape == (1,)
    with pytest.raises(SystemExit):
        module.register_env_family("Pendulum-v1", '{"tickers": ["AAA"]}')  # options for an id that takes none


def test_a_script_stops_on_an_unknown_ticker(workdir, prices):
    flags = ["--env-id", ENV_ID, "--env-options", json.dumps(options(prices, tickers=["AAA", "QQQ"]))]
    result = run_script("td3_continuous_action.py", *flags, cwd=workdir)
    assert_bad_input(result, workdir, "unknown ticker 'QQQ'", "--env-options for StockTrading-v0")
