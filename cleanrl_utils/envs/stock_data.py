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

Data that would train on something other than the market are refused, one line (DataError; exit 2 in the scripts)
naming the ticker, the dates and what to do, before any training; never repaired in silence:
- dates other than YYYY-MM-DD (dd/mm/yyyy cannot be told from mm/dd/yyyy), two rows of one ticker and date, dates of
  a ticker out of order;
- a missing, non-positive or non-numeric open, high, low or close, or a missing or negative volume (FinRL's
  YahooDownloader drops such rows, and its clean_data then drops the ticker);
- an unadjusted split: day t's close beyond 3x from day t-1's (|log(c_t / c_t-1)| > log 3, more than a large stock
  moves in a day) with the lasting jump a split shows: the median close of days t .. t+19 (SPLIT_WINDOW) beyond 2x
  that of days t-20 .. t-1, the same way, or the median volume beyond 2x the other way (shares multiply as the price
  divides). The default data's largest move, RRC's stale 1990 quote, is 3.001x, but its median moves 1.7x: no split.
  A real crash that deep which lasts is refused too; an unadjusted 2:1 or 3:2 split (a day real stocks can have) is
  not caught;
- a ticker without a row on a date that another chosen ticker trades within its own first and last date (FinRL's
  clean_data drops such a ticker from the data, without a word);
- a ticker listed after the first day of the chosen periods or ending before their last (FinRL's
  select_equal_rows_stock keeps the tickers with at least the mean number of rows), and a gap of more than
  MAX_CLOSED_DAYS calendar days in the periods with no row for any ticker (the longest US closure since 1933, after
  9/11, is 7 days).
Where FinRL drops a ticker, the error gives the `tickers` option that leaves it out.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import json
import re
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
SPLIT_MOVE = np.log(3.0)  # a day's close moving beyond 3x either way, ...
SPLIT_LEVEL = np.log(2.0)  # ... with the median close (or volume, the other way) moving beyond 2x ...
SPLIT_WINDOW = 20  # ... over this many days on each side, is taken for an unadjusted split
MAX_CLOSED_DAYS = 14  # calendar days between two trading days in a period: longer than any holiday closure


class DataError(ValueError):
    """Bad data or a bad choice of it: the message is one line naming the problem."""


@dataclass(frozen=True)
class Market:
    """Aligned daily data of N tickers over T trading days, as NumPy arrays."""

    dates: np.ndarray  # [T] datetime64[D], increasing: the days on which every ticker trades
    tickers: tuple[str, ...]
    close: np.ndarray  # [T, N] float64
    indicators: np.ndarray  # [T, N, K] float64, K = len(INDICATORS), in that order
    turbulence: np.ndarray  # [T] float64
    calendar: np.ndarray  # [D] datetime64[D]: the days on which any ticker trades (dates are those inside every span)
    spans: tuple[tuple[np.datetime64, np.datetime64], ...]  # each ticker's first and last day

    def between(self, start: np.datetime64, end: np.datetime64) -> Market:
        """The days with start <= date < end (FinRL's data_split)."""
        rows = slice(*np.searchsorted(self.dates, [start, end]))
        return dataclasses.replace(
            self,
            dates=self.dates[rows],
            close=self.close[rows],
            indicators=self.indicators[rows],
            turbulence=self.turbulence[rows],
        )


def leave_out(tic: str, tickers) -> str:
    """What to write to trade without `tic`."""
    others = [other for other in tickers if other != tic]
    if not others:
        return f"or choose other tickers than {tic}"
    return f'or leave {tic} out ("tickers": {json.dumps(others)})'


def some_dates(dates) -> str:
    """'2018-03-05', '2018-03-05, 2018-03-06' or '60 dates from 2018-03-05 to 2018-05-25'."""
    dates = [str(np.datetime64(date, "D")) for date in dates]
    return ", ".join(dates) if len(dates) <= 3 else f"{len(dates)} dates from {dates[0]} to {dates[-1]}"


def read_csv(path: str | Path):
    """FinRL's long-format CSV (one row per date and ticker) as a DataFrame, its form checked: the columns are there,
    dates are YYYY-MM-DD (anything after them, a time or a time zone, is ignored) and increase for each ticker, one
    row per ticker and date. The prices are checked by check_prices, for the tickers chosen."""
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
    frame["tic"] = frame["tic"].astype(str)
    text = frame["date"].astype(str).str.strip()
    iso = text.str.match(r"\d{4}-\d{2}-\d{2}(?:$|[ T])")
    dates = pd.to_datetime(text.str[:10].where(iso), format="%Y-%m-%d", errors="coerce")
    if dates.isna().any():
        row = int(np.argmax(dates.isna().to_numpy()))
        value, tic = text.iloc[row], frame["tic"].iloc[row]
        if re.fullmatch(r"\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}", value):
            raise DataError(
                f"{path}: line {row + 2} ({tic}) has the date {value!r}, day and month in an order that cannot be "
                "told (dd/mm/yyyy or mm/dd/yyyy): write the dates as YYYY-MM-DD, e.g. "
                "pd.to_datetime(frame.date, dayfirst=True).dt.strftime('%Y-%m-%d')"
            )
        raise DataError(f"{path}: line {row + 2} ({tic}) has the date {value!r}, not a date as YYYY-MM-DD")
    frame["date"] = dates
    twice = frame.duplicated(["tic", "date"], keep=False).to_numpy()
    if twice.any():
        tic, date = frame["tic"].iloc[np.argmax(twice)], frame["date"].iloc[np.argmax(twice)]
        lines = np.flatnonzero(twice & (frame["tic"] == tic).to_numpy() & (frame["date"] == date).to_numpy()) + 2
        same = " (identical)" if len(frame.iloc[lines - 2].drop_duplicates()) == 1 else ""
        raise DataError(
            f"{path}: {tic} has {len(lines)} rows for {date.date()}, lines {', '.join(map(str, lines))}{same}: "
            "keep one row per ticker and date"
        )
    for tic, rows in frame.groupby("tic", sort=False):
        steps = np.diff(rows["date"].to_numpy())
        if (steps <= np.timedelta64(0)).any():
            bad = int(np.argmax(steps <= np.timedelta64(0)))
            row, before, after = rows.index[bad + 1] + 2, rows["date"].iloc[bad], rows["date"].iloc[bad + 1]
            raise DataError(
                f"{path}: dates of {tic} do not increase at line {row} ({after.date()} after {before.date()}): "
                "sort each ticker's rows by date"
            )
    for column in FINRL_COLUMNS[2:]:
        frame[column] = pd.to_numeric(frame[column], errors="coerce")  # not a number: NaN, refused by check_prices
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


def check_prices(frame, tickers: tuple[str, ...], source: str) -> None:
    """DataError naming the ticker, the dates and what to do for the first of these in the rows of `tickers` (`frame`
    sorted by ticker and date, one row per ticker and date, as read_csv leaves it): a missing or non-positive price,
    a missing or negative volume, an unadjusted split, a date missing inside a ticker's span (see the module
    docstring)."""
    import pandas as pd

    calendar = np.unique(frame["date"].to_numpy().astype("datetime64[D]"))
    for tic in tickers:
        rows = frame[frame["tic"] == tic]
        dates = rows["date"].to_numpy().astype("datetime64[D]")
        for column in FINRL_COLUMNS[2:]:
            values = rows[column].to_numpy(float)
            bad = ~(np.isfinite(values) & ((values >= 0) if column == "volume" else (values > 0)))
            if bad.any():
                what = "negative" if column == "volume" else "not positive"
                raise DataError(
                    f"{source}: {tic} has a {column} that is missing or {what} ({float(values[bad][0])!r}) on "
                    f"{some_dates(dates[bad])}: fill in its {column}s from the data source, {leave_out(tic, tickers)}"
                )
        close, volume = rows["close"].to_numpy(float), rows["volume"].to_numpy(float)
        for t in np.flatnonzero(np.abs(np.diff(np.log(close))) > SPLIT_MOVE) + 1:
            before, after = slice(max(t - SPLIT_WINDOW, 0), t), slice(t, t + SPLIT_WINDOW)
            move, level = np.log(close[t] / close[t - 1]), np.log(np.median(close[after]) / np.median(close[before]))
            shares = np.median(volume[before]), np.median(volume[after])
            turnover = np.log(shares[1] / shares[0]) if min(shares) > 0 else 0.0
            signs = []
            if np.sign(level) == np.sign(move) and abs(level) > SPLIT_LEVEL:
                signs.append(f"the {SPLIT_WINDOW}-day median close x{np.exp(level):.3g}")
            if np.sign(turnover) == -np.sign(move) and abs(turnover) > SPLIT_LEVEL:
                signs.append(f"the median volume x{np.exp(turnover):.3g}")
            if signs:
                ratio = np.exp(abs(move))
                split = f"{ratio:.0f}:1 split" if move < 0 else f"1:{ratio:.0f} reverse split"
                raise DataError(
                    f"{source}: {tic}'s close goes from {close[t - 1]:.6g} on {dates[t - 1]} to {close[t]:.6g} on "
                    f"{dates[t]} (x{np.exp(move):.3g}; {' and '.join(signs)}): an unadjusted {split}? give "
                    "split-adjusted prices (yfinance's auto_adjust, as python -m cleanrl_utils.envs.stock_data "
                    f"downloads them), {leave_out(tic, tickers)}"
                )
        inside = calendar[(calendar >= dates[0]) & (calendar <= dates[-1])]
        missing = np.setdiff1d(inside, dates)
        if missing.size:
            first = pd.Timestamp(missing[0])
            traders = [other for other in tickers if ((frame["tic"] == other) & (frame["date"] == first)).any()]
            raise DataError(
                f"{source}: {tic} has no row for {some_dates(missing)}, which {', '.join(traders[:3])} "
                f"{'trade' if len(traders) > 1 else 'trades'} (a missing day would join two days' moves into one "
                f"step): add {tic}'s rows for them, {leave_out(tic, tickers)}"
            )


def build_market(frame, tickers: tuple[str, ...] | None = None, source: str = "the data") -> Market:
    """A Market from a long-format DataFrame: the rows checked (check_prices), indicators per ticker on its own
    history, then the tickers aligned on the dates they all trade, then turbulence over the aligned closes."""
    import pandas as pd

    frame = select(frame, tickers, source).sort_values(["tic", "date"], kind="stable")
    order = tuple(tickers) if tickers else tuple(sorted(frame["tic"].unique()))
    check_prices(frame, order, source)
    columns, spans = {}, []
    for tic in order:
        rows = frame[frame["tic"] == tic]
        dates = pd.DatetimeIndex(rows["date"]).normalize()
        values = np.column_stack([rows["close"].to_numpy(float), indicators(rows)])
        columns[tic] = pd.DataFrame(values, index=dates)
        spans.append(tuple(dates[[0, -1]].to_numpy().astype("datetime64[D]")))
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
        calendar=np.unique(frame["date"].to_numpy().astype("datetime64[D]")),
        spans=tuple(spans),
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
