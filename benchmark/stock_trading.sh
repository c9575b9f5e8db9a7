#!/usr/bin/env bash
# StockTrading-v0 (cleanrl_utils/envs/stock_trading.py, FinRL's stock trading) on the default data: 20 S&P 500 stocks'
# daily closes (shipped in skfolio), trained on 2009-01-01 .. 2019-12-31 (one-year episodes from random start days),
# backtested on 2020-01-02 .. 2022-12-28 (the COVID crash, the 2021 rally, the 2022 bear market) beside buy-and-hold
# and a daily-rebalanced equal weight of the same stocks. FinRL's defaults: $1M, hmax 100 shares, 0.1% costs, reward
# scaling 1e-4, no turbulence threshold. sac_continuous_action.py and ppo_continuous_action.py at their standard
# hyperparameters, seeds 1-3, one run at a time (2-core CPU machine), --save-model for the backtest.
# Steps: SAC 50k (about 200 one-year episodes; FinRL's tutorials train SAC 50k-70k), PPO 500k. Measured on the 2-core
# machine with the two parts side by side and other jobs: SAC 233 SPS alone with PPO, 25-40 loaded (14-35 min a
# seed), PPO about 1000-1500 (7-13 min a seed).
# Results: benchmark/results/stock_trading/backtest.md, .json and equity.png (the test period: each seed, mean +- std
# per script, both baselines); the training curves in benchmark/results/stock_trading_train.md and .png.
# Raw environment speed is a separate measurement: benchmark/stock_trading_sps.py.
set -euo pipefail
cd "$(dirname "$0")/.."
SAC_STEPS=50000
PPO_STEPS=500000
uv run --extra stocks python -m cleanrl_utils.benchmark --env-ids StockTrading-v0 --num-seeds 3 \
    --command "uv run --extra stocks python cleanrl/sac_continuous_action.py --total-timesteps $SAC_STEPS --save-model --torch-threads 1" \
    --output benchmark/results/stock_trading_sac
uv run --extra stocks python -m cleanrl_utils.benchmark --env-ids StockTrading-v0 --num-seeds 3 \
    --command "uv run --extra stocks python cleanrl/ppo_continuous_action.py --total-timesteps $PPO_STEPS --save-model" \
    --output benchmark/results/stock_trading_ppo
runs=(runs/StockTrading-v0__sac_continuous_action__* runs/StockTrading-v0__ppo_continuous_action__*)
uv run --extra stocks python -m cleanrl_utils.backtest "${runs[@]}" --output benchmark/results/stock_trading --no-cuda
uv run python -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/stock_trading_train
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/stock_trading_train.png
