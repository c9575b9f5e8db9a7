"""Daily prices for StockTrading-v0 (cleanrl_utils/envs/stock_trading.py): the offline default, FinRL's long-format
CSV, an optional yfinance download, and FinRL's technical indicators and turbulence index, all causal.

    market = load_market("default")                       # 20 S&P 500 stocks, daily closes 1990-01-02 .. 2022-12-28
    market = load_market("prices.csv", ("AAPL", "MSFT"))  # FinRL's long format: date, tic, open, high, low, close,
                                                          # volume
    python -m cleanrl_utils.envs.stock_data AAPL MSFT JPM --start 2009-01-01 --end 2023-01-01 --output prices.csv

The default data ships inside the skfolio package (skfolio/datasets/data/sp500_dataset.csv.gz, read as a file:
skfolio itself is never imported): the dividend- and split-adjusted daily closes, rounded to 3 decimals, of AAPL,
AMD, BAC, BBY, CVX, GE, HD, JNJ, JPM, KO, LLY, MRK, MSFT, PEP, PFE, PG, RRC, UNH, WMT and XOM, 8313 trading days.
It has closes only, so open = high = low = close there: CCI and DX are then computed on closes (a typical price equal
to the close, true ranges from close to close). No package we found ships several stocks' daily OHLCV (backtesting
and gym-anytrading ship Google's alone, arch indices, cvxportfolio one year of returns); a CSV from yfinance (the
command above, the `yfinance` extra, online) or any other source gives the real highs and lows.

Indicators: FinRL's list (INDICATORS: MACD 12/26, Bollinger bands 20 +- 2 std, RSI-30, CCI-30, DX-30, 30- and 60-day
SMA of the close), computed by stockstats per ticker on its whole history, as FinRL does. Each is a trailing window
or an exponential average, so its value on day t uses days <= t only. FinRL then fills gaps with ffill().bfill(): the
bfill copies later values into the first days (a look-ahead); here the few undefined first values are forward-filled,
else 0. Turbulence: FinRL's calculate_turbulence, the Mahalanobis distance (squared) of day t's returns from the mean
of the previous 252 days' returns under their covariance (pseudo-inverse); 0 for the first 252 days and, as in
FinRL, for the first two positive values. Tickers are aligned on the dates that all of them trade.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import sys
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

FINRL_COLUMNS = ("date", "tic", "open", "high", "low", "close", "volume")
INDICATORS = ("macd", "boll_ub", "boll_lb", "rsi_30", "cci_30", "dx_30", "close_30_sma", "close_60_sma")
TURBULENCE_WINDOW = 252  # trading days: one year, as FinRL
DEFAULT_FILE = ("skfolio", "datasets/data/sp500_dataset.csv.gz")  # (package, path inside it)


class DataError(ValueError):
    """Bad data or a bad choice of it: the message is one line naming the problem."""


@dataclass(frozen=True)
class Market:
    """Aligned daily data of N tickers over T trading days, as NumPy arrays."""

    dates: np.ndarray  # [T] datetime64[D], increasing
    tickers: tuple[str, ...]
    close: np.ndarray  # [T, N] float64
    indicators: np.ndarray  # [T, N, K] float64, K = len(INDICATORS), in that order
    turbulence: np.ndarray  # [T] float64

    def between(self, start: np.datetime64, end: np.datetime64) -> Market:
        """The days with start <= date < end (FinRL's data_split)."""
        rows = slice(*np.searchsorted(self.dates, [start, end]))
        return Market(self.dates[rows], self.tickers, self.close[rows], self.indicators[rows], self.turbulence[rows])


def read_csv(path: str | Path):
    """FinRL's long-format CSV (one row per date and ticker) as a DataFrame, checked: the columns are there, dates
    parse and increase for each ticker, closes are positive numbers."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file (data is 'default' or a CSV in FinRL's long format)")
    frame = pd.read_csv(path)
    frame.columns = [str(column).strip().lower() for column in frame.columns]
    missing = [column for column in FINRL_COLUMNS if column not in frame.columns]
    if missing:
        raise DataError(
            f"{path}: missing columns {', '.join(missing)} (FinRL's long format: {', '.join(FINRL_COLUMNS)})"
        )
    try:
        frame["date"] = pd.to_datetime(frame["date"], format="mixed").dt.normalize()
    except (ValueError, TypeError) as error:
        raise DataError(f"{path}: a date does not parse ({str(error).splitlines()[0]})") from None
    frame["tic"] = frame["tic"].astype(str)
    for tic, rows in frame.groupby("tic", sort=False):
        steps = np.diff(rows["date"].to_numpy())
        if (steps <= np.timedelta64(0)).any():
            bad = int(np.argmax(steps <= np.timedelta64(0)))
            row, before, after = rows.index[bad + 1] + 2, rows["date"].iloc[bad], rows["date"].iloc[bad + 1]
            raise DataError(
                f"{path}: dates of {tic} do not increase at line {row} ({after.date()} after {before.date()})"
            )
    close = pd.to_numeric(frame["close"], errors="coerce")
    if not (np.isfinite(close) & (close > 0)).all():
        row = int(np.argmax(~(np.isfinite(close) & (close > 0))))
        raise DataError(f"{path}: line {row + 2} has no positive close ({frame['close'].iloc[row]!r})")
    return frame


def default_prices():
    """The default data (see the module docstring) in FinRL's long format."""
    import pandas as pd

    package, inside = DEFAULT_FILE
    spec = importlib.util.find_spec(package)  # finds the installed package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"the default data ships in the {package} package, which is not installed: install the stocks extra "
            "(uv sync --extra stocks) or give data as a CSV"
        )
    wide = pd.read_csv(Path(spec.submodule_search_locations[0]) / inside, parse_dates=["Date"])
    frame = wide.melt(id_vars="Date", var_name="tic", value_name="close").rename(columns={"Date": "date"})
    for column in ("open", "high", "low"):
        frame[column] = frame["close"]  # closes only: see the module docstring
    frame["volume"] = 0.0
    return frame[list(FINRL_COLUMNS)].dropna(subset=["close"])


def indicators(frame) -> np.ndarray:
    """FinRL's INDICATORS of one ticker's rows (sorted by date) as [rows, K], by stockstats."""
    try:
        from stockstats import StockDataFrame
    except ImportError:
        raise DataError("the technical indicators need stockstats: install the stocks extra (uv sync --extra stocks)")
    with warnings.catch_warnings():  # stockstats 0.6.10 calls set_index(inplace=True), which pandas 3.1 deprecates
        warnings.filterwarnings("ignore", message="The inplace keyword")
        stock = StockDataFrame.retype(frame[list(FINRL_COLUMNS)].copy())
        values = stock[list(INDICATORS)].astype(float)
    # Forward fill only: a gap takes the last value before it, never a later one.
    return values.ffill().fillna(0.0).to_numpy()


def turbulence(close: np.ndarray, window: int = TURBULENCE_WINDOW) -> np.ndarray:
    """FinRL's turbulence index of [T, N] closes: for day t >= window, (r_t - mean) C^+ (r_t - mean) with r the daily
    returns (close / previous close - 1), mean and C (ddof 1) those of the returns of days t - window .. t - 1 (day 0
    has none), C^+ the pseudo-inverse; 0 before, and for the first two positive values (FinRL's warm-up)."""
    returns = close[1:] / close[:-1] - 1.0  # returns[d - 1] is day d's
    values, positive = np.zeros(len(close)), 0
    for t in range(window, len(close)):
        history = returns[max(t - window, 1) - 1 : t - 1]
        deviation = returns[t - 1] - history.mean(0)
        value = deviation @ np.linalg.pinv(np.atleast_2d(np.cov(history, rowvar=False))) @ deviation
        if value > 0:
            positive += 1
            values[t] = value if positive > 2 else 0.0
    return values


def select(frame, tickers: tuple[str, ...] | None, source: str):
    """The rows of `tickers` (all tickers when None); an unknown ticker fails naming the nearest known ones."""
    known = sorted(frame["tic"].unique())
    for tic in tickers or ():
        if tic not in known:
            near = difflib.get_close_matches(tic, known, n=3)
            hint = f"did you mean {', '.join(near)}?" if near else f"it has {', '.join(known[:25])}"
            raise DataError(f"unknown ticker {tic!r}: not in {source} ({hint})")
    return frame[frame["tic"].isin(tickers)] if tickers else frame


def build_market(frame, tickers: tuple[str, ...] | None = None, source: str = "the data") -> Market:
    """A Market from a long-format DataFrame: indicators per ticker on its own history, then the tickers aligned on
    the dates they all trade, then turbulence over the aligned closes."""
    import pandas as pd

    frame = select(frame, tickers, source).sort_values(["tic", "date"], kind="stable")
    order = tuple(tickers) if tickers else tuple(sorted(frame["tic"].unique()))
    columns = {}
    for tic in order:
        rows = frame[frame["tic"] == tic]
        dates = pd.DatetimeIndex(rows["date"]).normalize()
        values = np.column_stack([rows["close"].to_numpy(float), indicators(rows)])
        columns[tic] = pd.DataFrame(values, index=dates)
    joined = pd.concat(columns, axis=1, join="inner")  # the dates on which every ticker trades
    if len(joined) < 2:
        raise DataError(f"{source}: fewer than 2 dates on which all of {', '.join(order)} trade")
    values = joined.to_numpy().reshape(len(joined), len(order), 1 + len(INDICATORS))
    close = np.ascontiguousarray(values[:, :, 0])
    return Market(
        dates=joined.index.to_numpy().astype("datetime64[D]"),
        tickers=order,
        close=close,
        indicators=np.ascontiguousarray(values[:, :, 1:]),
        turbulence=turbulence(close),
    )


@lru_cache(maxsize=8)
def _cached_market(data: str, tickers: tuple[str, ...] | None, modified: int | None) -> Market:
    frame = default_prices() if data == "default" else read_csv(data)
    return build_market(frame, tickers, "the default data" if data == "default" else data)


def load_market(data: str = "default", tickers: tuple[str, ...] | None = None) -> Market:
    """The Market of `data` ("default" or a CSV path) and `tickers` (None: all), computed once per process (a CSV again
    when the file changes)."""
    modified = Path(data).stat().st_mtime_ns if data != "default" and Path(data).is_file() else None
    return _cached_market(data, tuple(tickers) if tickers else None, modified)


def download(tickers: list[str], start: str, end: str):
    """Daily OHLCV of `tickers` from Yahoo Finance (online; the `yfinance` extra) in FinRL's long format: prices
    adjusted for splits and dividends, as FinRL's YahooDownloader uses them; `end` is exclusive."""
    import pandas as pd

    try:
        import yfinance
    except ImportError:
        raise DataError("downloading needs yfinance: install the yfinance extra (uv sync --extra yfinance)") from None
    frames = []
    for tic in tickers:
        history = yfinance.Ticker(tic).history(start=start, end=end, interval="1d", auto_adjust=True)
        if history.empty:
            raise DataError(f"yfinance returned no prices for {tic!r} between {start} and {end}")
        history = history.rename(columns=str.lower).reset_index().rename(columns={"Date": "date", "index": "date"})
        history["date"] = pd.to_datetime(history["date"]).dt.strftime("%Y-%m-%d")
        history["tic"] = tic
        frames.append(history[list(FINRL_COLUMNS)])
    return pd.concat(frames).sort_values(["date", "tic"], kind="stable").reset_index(drop=True)


def main(argv: list[str] | None = None) -> None:
    from cleanrl_utils.errors import fail

    parser = argparse.ArgumentParser(
        prog="python -m cleanrl_utils.envs.stock_data",
        description="Download daily prices with yfinance into a FinRL long-format CSV (online), for StockTrading-v0's "
        'data option: --env-options \'{"data": "prices.csv"}\'.',
    )
    parser.add_argument("tickers", nargs="+", help="ticker symbols, e.g. AAPL MSFT JPM")
    parser.add_argument("--start", required=True, help="first date, YYYY-MM-DD")
    parser.add_argument("--end", required=True, help="end date (exclusive), YYYY-MM-DD")
    parser.add_argument("--output", type=Path, required=True, help="the CSV written")
    args = parser.parse_args(argv)
    try:
        frame = download(args.tickers, args.start, args.end)
    except DataError as error:
        fail(str(error))
    frame.to_csv(args.output, index=False)
    print(f"{len(frame)} rows ({frame['tic'].nunique()} tickers, {frame['date'].nunique()} dates) -> {args.output}")


if __name__ == "__main__":
    main(sys.argv[1:])
