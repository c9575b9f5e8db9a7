"""Backtest saved StockTrading-v0 models over the test period, beside buy-and-hold and a daily-rebalanced equal weight.

    python -m cleanrl_utils.backtest runs/StockTrading-v0__sac_continuous_action__1__1700000000
    python -m cleanrl_utils.backtest runs/StockTrading-v0__*__* --output benchmark/results/stock_trading

Each argument is a run directory holding one *.cleanrl_model, or the file, saved (--save-model) by a continuous-action
script trained on StockTrading-v0 (ppo, sac, td3, ddpg or redq_continuous_action.py). The model's own script plays
it, through its evaluate() as cleanrl_utils.evaluate does (its networks and observation normalisation as saved,
the deterministic mean action), for one episode: the whole test period of the market it trained on (its
--env-options with period "test"; the env records each day's accounts). Several models must share that market.

Beside them, on the same stocks and days, from the same initial cash and with the same proportional cost:
- buy-and-hold: equal amounts of every stock bought at the first day's close, then held;
- equal weight: the same, rebalanced to equal weights at every close but the last; the fees come out of the value
  being rebalanced (the post-trade value V' solves V' = V - cost sum_i |V'/N - x_i|, exactly, by iteration).
Both hold fractional shares (the agent trades whole ones).

Statistics (statistics()), from the value V_t at each close before that day's trades and r_t = V_t / V_{t-1} - 1 over
n days: cumulative return V_n / V_0 - 1; annualised return (V_n / V_0)^(252 / n) - 1; annualised volatility
std(r, ddof 1) sqrt(252); Sharpe ratio mean(r) / std(r, ddof 1) sqrt(252), risk-free rate 0; maximum drawdown
min_t V_t / max_{s<=t} V_s - 1; turnover: sum_t traded_t / V_t x 252 / n (buys and sells, per year); costs: the fees
paid over the initial cash. These are empyrical's (and so pyfolio's and FinRL's backtest_stats') conventions, in
NumPy: empyrical-reloaded would be a dependency for five one-line formulas and computes neither turnover nor costs.

Writes into --output (default <run dir>/backtest with one model; required with several): backtest.md (the table; with
several runs of one script also their mean +- std, ddof 0), backtest.json (the figures and the daily values) and
equity.png (the equity curves). A model that is not a StockTrading one, or models of different markets, stop with one
line naming the problem.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from cleanrl_utils.checkpoint import find_model, load_script, read_model
from cleanrl_utils.errors import fail

TRADING_DAYS = 252
STATISTICS = {  # key: (column title, format)
    "cumulative_return": ("cumulative return", "{:+.1%}"),
    "annual_return": ("annualised return", "{:+.1%}"),
    "annual_volatility": ("annualised volatility", "{:.1%}"),
    "sharpe_ratio": ("Sharpe ratio", "{:.2f}"),
    "max_drawdown": ("max drawdown", "{:.1%}"),
    "turnover": ("turnover per year", "{:.2f}"),
    "costs": ("costs / initial cash", "{:.2%}"),
}


def statistics(values, fees=None, traded=None) -> dict[str, float]:
    """The report's figures for daily values V_0..V_n (each before that day's trades) and each day's fees and traded
    value (None: no trades); see the module docstring."""
    values = np.asarray(values, np.float64)
    returns, days = values[1:] / values[:-1] - 1.0, len(values) - 1
    std = returns.std(ddof=1)
    fees = np.zeros_like(values) if fees is None else np.asarray(fees, np.float64)
    traded = np.zeros_like(values) if traded is None else np.asarray(traded, np.float64)
    return {
        "cumulative_return": values[-1] / values[0] - 1.0,
        "annual_return": (values[-1] / values[0]) ** (TRADING_DAYS / days) - 1.0,
        "annual_volatility": std * np.sqrt(TRADING_DAYS),
        "sharpe_ratio": returns.mean() / std * np.sqrt(TRADING_DAYS) if std > 0 else float("nan"),
        "max_drawdown": (values / np.maximum.accumulate(values) - 1.0).min(),
        "turnover": (traded / values).sum() * TRADING_DAYS / days,
        "costs": fees.sum() / values[0],
    }


def buy_and_hold(close: np.ndarray, cash: float, cost: float) -> dict[str, np.ndarray]:
    """Equal amounts of each stock bought at the first close (fees included), then held: daily values, fees, traded."""
    days, n = close.shape
    shares = cash / n / (close[0] * (1.0 + cost))
    values = np.concatenate([[cash], close[1:] @ shares])
    fees, traded = np.zeros(days), np.zeros(days)
    traded[0] = cash / (1.0 + cost)
    fees[0] = traded[0] * cost
    return {"value": values, "fees": fees, "traded": traded}


def equal_weight(close: np.ndarray, cash: float, cost: float) -> dict[str, np.ndarray]:
    """Rebalanced to equal weights at every close but the last, the fees paid from the value: daily values, fees,
    traded."""
    days, n = close.shape
    shares, values, fees, traded = np.zeros(n), np.zeros(days), np.zeros(days), np.zeros(days)
    for t in range(days):
        positions = shares * close[t]
        values[t] = cash + positions.sum()
        if t == days - 1:
            break
        after = values[t]
        for _ in range(100):  # V' = V - cost sum |V'/n - x|: a contraction by at most `cost`, converges in a few steps
            new = values[t] - cost * np.abs(after / n - positions).sum()
            if new == after:
                break
            after = new
        traded[t] = np.abs(after / n - positions).sum()
        fees[t] = values[t] - after
        shares, cash = after / n / close[t], 0.0
    return {"value": values, "fees": fees, "traded": traded}


def play(model_path: Path, device) -> tuple[dict, dict]:
    """(model, the test period's record) of one saved model, played by its own script's evaluate()."""
    import torch

    model = read_model(model_path)
    if not str(model.get("env_id", "")).startswith("StockTrading"):
        fail(f"{model_path}: a model for {model.get('env_id')}, not StockTrading-v0; backtests need a stock model")
    module = load_script(model)
    options = json.loads(model.get("args", {}).get("env_options") or "{}")
    data = Path(options.get("data", "default"))
    if options.get("data", "default") != "default" and not data.is_absolute() and not data.exists():
        # a CSV named relative to where training ran: runs/<run>/ sits in that directory
        trained_in = model_path.resolve().parents[2] / data
        options["data"] = str(trained_in) if trained_in.exists() else options["data"]
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "record.npz"
        test_options = {**options, "period": "test", "record": str(record)}
        # The same model with the test period as its environment options: its script's evaluate() then builds
        # that environment exactly as training built the training one.
        copy = Path(tmp) / model_path.name
        torch.save({**model, "args": {**model["args"], "env_options": json.dumps(test_options)}}, copy)
        module.evaluate(copy, 1, device, seed=0)
        with np.load(record) as data:
            return model, {key: data[key] for key in data.files}


def markdown_table(rows: dict[str, dict[str, float]], spread: dict[str, dict[str, float]]) -> list[str]:
    titles = [title for title, _ in STATISTICS.values()]
    lines = ["| portfolio | " + " | ".join(titles) + " |", "|---" * (len(titles) + 1) + "|"]
    for label, figures in rows.items():
        cells = []
        for key, (_, form) in STATISTICS.items():
            cell = form.format(figures[key])
            if label in spread:
                cell += " +- " + form.format(spread[label][key]).lstrip("+")
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def plot(curves: dict[str, tuple[str, np.ndarray]], dates: np.ndarray, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    colors = {}
    for label, (group, values) in curves.items():
        if group in ("buy-and-hold", "equal weight"):
            style = {"color": "black" if group == "buy-and-hold" else "gray", "linestyle": "--", "linewidth": 1.5}
        else:
            style = {"color": colors.setdefault(group, f"C{len(colors)}"), "linewidth": 1.0, "alpha": 0.8}
        ax.plot(dates, values, label=label, **style)
    ax.set_title(title)
    ax.set_ylabel("portfolio value ($)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def backtest(paths: list[Path], output: Path | None = None, cuda: bool = True) -> dict:
    """Play every model, compute the statistics, write the report; returns the backtest.json contents."""
    import torch

    device = torch.device("cuda" if cuda and torch.cuda.is_available() else "cpu")
    model_paths = [find_model(Path(path)) for path in paths]
    if output is None:
        if len(model_paths) > 1:
            fail("--output is required with several models")
        output = model_paths[0].parent / "backtest"
    played = [play(path, device) for path in model_paths]
    first = played[0][1]
    for path, (_, record) in zip(model_paths[1:], played[1:]):
        if not (
            np.array_equal(record["dates"], first["dates"]) and np.array_equal(record["tickers"], first["tickers"])
        ):
            fail(f"{path} was tested on other stocks or days than {model_paths[0]}; backtest them separately")
    options = json.loads(played[0][0]["args"].get("env_options") or "{}")
    from cleanrl_utils.envs.stock_trading import StockOptions

    defaults = StockOptions(**options)
    cash, cost, close = float(first["value"][0]), defaults.cost, first["close"]

    rows, curves, groups = {}, {}, {}
    for (model, record), path in zip(played, model_paths):
        label = f"{model['script']} seed {model['args'].get('seed')}"
        label = label if label not in rows else f"{label} ({path.parent.name})"
        rows[label] = statistics(record["value"], record["fees"], record["traded"])
        curves[label] = (model["script"], record["value"])
        groups.setdefault(model["script"], []).append(label)
    spread = {}
    for script, labels in groups.items():
        if len(labels) > 1:
            table = {key: np.array([rows[label][key] for label in labels]) for key in STATISTICS}
            name = f"{script} ({len(labels)} runs)"
            rows[name] = {key: float(values.mean()) for key, values in table.items()}
            spread[name] = {key: float(values.std()) for key, values in table.items()}
    for name, baseline in (("buy-and-hold", buy_and_hold), ("equal weight", equal_weight)):
        result = baseline(close, cash, cost)
        rows[name] = statistics(result["value"], result["fees"], result["traded"])
        curves[name] = (name, result["value"])

    dates = first["dates"].astype("datetime64[D]")
    tickers = [str(tic) for tic in first["tickers"]]
    period = f"{dates[0]} .. {dates[-1]}"
    header = [
        f"# StockTrading-v0 backtest, {period}",
        "",
        f"Test period {period} ({len(dates)} trading days), {len(tickers)} stocks ({', '.join(tickers)}), "
        f"initial cash ${cash:,.0f}, cost {cost:.2%} of every trade, data {defaults.data!r}. The agents play their "
        "mean action; statistics as in cleanrl_utils/backtest.py (252 trading days a year, risk-free rate 0).",
        "",
    ]
    output.mkdir(parents=True, exist_ok=True)
    lines = header + markdown_table(rows, spread)
    (output / "backtest.md").write_text("\n".join(lines) + "\n")
    plot(curves, dates, f"StockTrading-v0 test period {period}", output / "equity.png")
    report = {
        "period": [str(dates[0]), str(dates[-1])],
        "tickers": tickers,
        "initial_cash": cash,
        "cost": cost,
        "models": [str(path) for path in model_paths],
        "statistics": {label: {key: float(value) for key, value in figures.items()} for label, figures in rows.items()},
        "spread": spread,
        "values": {label: [float(v) for v in values] for label, (_, values) in curves.items()},
        "dates": [str(date) for date in dates],
    }
    (output / "backtest.json").write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(lines[2:]))
    print(f"report, figures and equity curves: {output}/backtest.md, backtest.json, equity.png")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cleanrl_utils.backtest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", type=Path, nargs="+", help="run directories with a *.cleanrl_model, or the files")
    parser.add_argument("--output", type=Path, default=None, help="the report's folder (default <run dir>/backtest)")
    parser.add_argument(
        "--cuda", action=argparse.BooleanOptionalAction, default=True, help="use a GPU when present (default)"
    )
    args = parser.parse_args(argv)
    backtest(args.paths, args.output, args.cuda)


if __name__ == "__main__":
    main(sys.argv[1:])
