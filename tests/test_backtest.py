"""cleanrl_utils/backtest.py: the statistics and the two baselines against hand computations on made-up curves, and
smoke runs of the four continuous scripts on StockTrading-v0 with --save-model, backtested together; bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import assert_finite_keys, read_scalars, run_dirs, run_script
from test_stock_trading import write_prices

from cleanrl_utils import backtest
from cleanrl_utils.checkpoint import MODEL_FORMAT

SMOKE = {  # tiny runs: a few hundred steps, one evaluation episode
    "ppo_continuous_action.py": ["--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "1"],
    "sac_continuous_action.py": ["--learning-starts", "64", "--batch-size", "16", "--buffer-size", "500"],
    "td3_continuous_action.py": ["--learning-starts", "64", "--batch-size", "16", "--buffer-size", "500"],
    "ddpg_continuous_action.py": ["--learning-starts", "64", "--batch-size", "16", "--buffer-size", "500"],
}


def test_statistics_of_a_made_up_equity_curve():
    values = [100.0, 110.0, 99.0, 108.9, 130.68]  # daily returns +10%, -10%, +10%, +20%
    traded, fees = [10.0, 0.0, 22.0, 0.0, 0.0], [0.01, 0.0, 0.022, 0.0, 0.0]
    figures = backtest.statistics(values, fees, traded)
    mean = (0.1 - 0.1 + 0.1 + 0.2) / 4  # 0.075
    std = math.sqrt(((0.1 - mean) ** 2 + (-0.1 - mean) ** 2 + (0.1 - mean) ** 2 + (0.2 - mean) ** 2) / 3)
    assert figures["cumulative_return"] == pytest.approx(0.3068)
    assert figures["annual_return"] == pytest.approx(1.3068 ** (252 / 4) - 1)
    assert figures["annual_volatility"] == pytest.approx(std * math.sqrt(252)) and std == pytest.approx(0.1258306)
    assert figures["sharpe_ratio"] == pytest.approx(mean / std * math.sqrt(252))
    assert figures["max_drawdown"] == pytest.approx(99 / 110 - 1)  # the peak 110, the trough 99 after it
    assert figures["turnover"] == pytest.approx((10 / 100 + 22 / 99) * 252 / 4)
    assert figures["costs"] == pytest.approx(0.032 / 100)
    flat = backtest.statistics([5.0, 5.0, 5.0])
    assert flat["cumulative_return"] == 0 and flat["max_drawdown"] == 0 and math.isnan(flat["sharpe_ratio"])


def test_buy_and_hold_and_equal_weight_by_hand():
    close = np.array([[10.0, 20.0], [11.0, 18.0], [12.0, 18.0]])
    hold = backtest.buy_and_hold(close, 1000.0, 0.01)
    shares = np.array([500 / (10 * 1.01), 500 / (20 * 1.01)])  # equal amounts, the fee on top of each
    np.testing.assert_allclose(hold["value"], [1000, shares @ close[1], shares @ close[2]])
    np.testing.assert_allclose(hold["fees"], [1000 / 1.01 * 0.01, 0, 0])
    np.testing.assert_allclose(hold["traded"], [1000 / 1.01, 0, 0])
    equal = backtest.equal_weight(close, 1000.0, 0.01)
    # Day 0 as buy-and-hold; day 1: positions 544.55 and 445.54 around the target V'/2, so the traded value is their
    # difference whatever V' is: V' = V - 0.01 (544.55 - 445.54); day 2 holds V'/2 of each at day 1's prices.
    positions = shares * close[1]
    after = positions.sum() - 0.01 * (positions[0] - positions[1])
    np.testing.assert_allclose(equal["value"], [1000, positions.sum(), after / 2 * (12 / 11 + 18 / 18)])
    np.testing.assert_allclose(equal["fees"], [1000 / 1.01 * 0.01, 0.01 * (positions[0] - positions[1]), 0])
    np.testing.assert_allclose(equal["traded"][:2], [1000 / 1.01, positions[0] - positions[1]])


def stock_options(prices, **extra) -> str:
    return json.dumps({"data": str(prices), "train_start": "2018-01-01", "test_start": "2019-01-01", **extra})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Run directories of the four scripts, each trained a few hundred steps with --save-model on made-up prices."""
    workdir = tmp_path_factory.mktemp("runs")
    write_prices(workdir / "prices.csv", days=330)
    for script, flags in SMOKE.items():
        # a path relative to where training runs: the backtest (run from elsewhere) finds it beside runs/
        common = ["--env-id", "StockTrading-v0", "--env-options", stock_options("prices.csv", episode_days=64)]
        common += ["--total-timesteps", "128", "--torch-threads", "1", "--save-model", "--eval-episodes", "1"]
        result = run_script(script, *common, *flags, cwd=workdir)
        assert result.returncode == 0, f"{script}: {result.stderr}"
    return workdir, run_dirs(workdir)


def test_the_four_scripts_train_save_and_evaluate_on_it(trained):
    _, runs = trained
    assert sorted(run.name.split("__")[1] for run in runs) == sorted(s.removesuffix(".py") for s in SMOKE)
    for run in runs:
        assert_finite_keys(read_scalars(run), ["charts/episodic_return", "charts/SPS", "eval/episodic_return"])
        assert json.loads((run / "args.json").read_text())["env_options"].startswith('{"data"')


def test_backtest_of_the_four_models(trained, tmp_path):
    workdir, runs = trained
    output = tmp_path / "report"
    backtest.main([str(run) for run in runs] + ["--output", str(output), "--no-cuda"])
    report = json.loads((output / "backtest.json").read_text())
    days = len(report["dates"])
    assert report["period"][0] == "2019-01-01" and days == 330 - 261 and len(report["tickers"]) == 3
    assert set(report["statistics"]) == {f"{s.removesuffix('.py')} seed 1" for s in SMOKE} | {
        "buy-and-hold",
        "equal weight",
    }
    for label, values in report["values"].items():
        assert len(values) == days and values[0] == 1e6, label
    for label in ("buy-and-hold", "equal weight"):
        assert np.isfinite(list(report["statistics"][label].values())).all()
    assert (output / "equity.png").stat().st_size > 10_000
    table = (output / "backtest.md").read_text()
    assert "| buy-and-hold |" in table and "max drawdown" in table and "2019-01-01 .. " in table

    # The record is the accounts of the episode the model's own script played: each day's value is cash plus
    # holdings at the close, and a second backtest plays it again identically (deterministic).
    model = backtest.find_model(runs[1])
    _, record = backtest.play(model, torch.device("cpu"))
    holdings, cash, close = record["holdings"], record["cash"], record["close"]
    assert (holdings >= 0).all() and (holdings == np.round(holdings)).all() and (cash >= 0).all()
    np.testing.assert_allclose(record["value"], cash + (holdings * close).sum(-1), rtol=1e-12)
    label = f"{model.stem} seed 1"
    np.testing.assert_allclose(record["value"], report["values"][label], rtol=1e-12)


def test_one_model_reports_into_its_run_directory(trained):
    _, runs = trained
    backtest.main([str(runs[0]), "--no-cuda"])
    assert (runs[0] / "backtest" / "backtest.md").is_file() and (runs[0] / "backtest" / "equity.png").is_file()


def test_bad_input_stops_in_one_line(tmp_path, capsys):
    pendulum = tmp_path / "sac_continuous_action.cleanrl_model"
    torch.save(
        {"format": MODEL_FORMAT, "script": "sac_continuous_action", "env_id": "Pendulum-v1", "args": {}}, pendulum
    )
    for argv, fragment in (
        ([str(pendulum)], "a model for Pendulum-v1, not StockTrading-v0"),
        ([str(tmp_path / "missing")], "no such file or directory"),
        ([str(pendulum), str(pendulum)], "--output is required with several models"),
    ):
        with pytest.raises(SystemExit) as stopped:
            backtest.main(argv)
        lines = capsys.readouterr().err.strip().splitlines()
        assert stopped.value.code == 2 and len(lines) == 1 and fragment in lines[0], lines
