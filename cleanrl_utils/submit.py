"""Run a benchmark grid as AWS Batch jobs, one per environment x seed, the runs synced through S3.

    python -m cleanrl_utils.submit --env-ids Hopper-v5 Walker2d-v5 --num-seeds 3 \
        --command "python cleanrl/sac_continuous_action.py --checkpoint-every 50000" --image IMAGE \
        --job-queue JOB_QUEUE --bucket BUCKET --job-role JOB_ROLE --prefix sac-mujoco --gpus 1
    python -m cleanrl_utils.submit fetch --bucket BUCKET --prefix sac-mujoco      # every job's runs into runs/

Registers a job definition for the image (the repository's Dockerfile) and submits the commands the benchmark runner
would run (--command + `--env-id ENV --seed SEED`), listed in s3://BUCKET/PREFIX/jobs.json. Each job runs
`python -m cleanrl_utils.submit job ... -- COMMAND` in the container: its S3 folder restored into runs/, the command
run through the benchmark runner, runs/ uploaded back, also after Batch's SIGTERM (the run writes its checkpoint
first). A retry after a reclaimed spot host therefore continues the run from its last checkpoint. With --track in the
command, WANDB_API_KEY is passed on. benchmark/cloud/batch.yaml (CloudFormation) makes the queue, the bucket and the
jobs' role. AWS credentials and region come from boto3's usual places; bad arguments stop in one line before any
AWS call.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from cleanrl_utils.benchmark import make_jobs, script_stem
from cleanrl_utils.errors import fail


def client(service: str, region: str | None):
    try:
        import boto3
    except ImportError:
        fail("cleanrl_utils.submit needs boto3: uv sync --extra cloud")
    return boto3.client(service, region_name=region)


def job_folder(env_id: str, seed: int) -> str:
    """The S3 folder (under --prefix) and the Batch job name suffix of one environment x seed."""
    return f"{re.sub(r'[^A-Za-z0-9_-]', '-', env_id)}__{seed}"


def submit(args: argparse.Namespace) -> list[dict]:
    """Register the job definition and submit one job per environment x seed; returns what jobs.json lists."""
    stem = script_stem(args.command) or "cleanrl"
    batch = client("batch", args.region)
    resources = [{"type": "VCPU", "value": str(args.vcpus)}, {"type": "MEMORY", "value": str(args.memory)}]
    if args.gpus:
        resources.append({"type": "GPU", "value": str(args.gpus)})
    definition = batch.register_job_definition(
        jobDefinitionName=f"cleanrl-{stem}"[:128],
        type="container",
        # Each job gives its own command (containerOverrides); the definition's is a placeholder Batch requires.
        containerProperties={
            "image": args.image,
            "command": ["python", "-V"],
            "resourceRequirements": resources,
            **({"jobRoleArn": args.job_role} if args.job_role else {}),  # the role that may use the bucket
        },
        # Retry a job whose host went away (a spot reclaim); a job that failed on its own stays failed.
        retryStrategy={
            "attempts": args.attempts,
            "evaluateOnExit": [{"onStatusReason": "Host EC2*", "action": "RETRY"}, {"onReason": "*", "action": "EXIT"}],
        },
        timeout={"attemptDurationSeconds": int(args.hours * 3600)},
    )
    environment = []
    if "--track" in shlex.split(args.command) and os.environ.get("WANDB_API_KEY"):
        environment.append({"name": "WANDB_API_KEY", "value": os.environ["WANDB_API_KEY"]})
    submitted = []
    for job in make_jobs(args.command, args.env_ids, list(range(args.start_seed, args.start_seed + args.num_seeds))):
        folder = job_folder(job.env_id, job.seed)
        inner = ["python", "-m", "cleanrl_utils.submit", "job", "--bucket", args.bucket, "--prefix"]
        inner += [f"{args.prefix}/{folder}", "--env-id", job.env_id, "--seed", str(job.seed), "--"]
        inner += shlex.split(args.command)
        response = batch.submit_job(
            jobName=f"{stem}-{folder}"[:128],
            jobQueue=args.job_queue,
            jobDefinition=definition["jobDefinitionArn"],
            containerOverrides={"command": inner, "environment": environment},
        )
        submitted.append({"job_id": response["jobId"], "name": response["jobName"], "folder": folder})
        submitted[-1].update(env_id=job.env_id, seed=job.seed, command=job.command)
        print(f"submitted {response['jobName']} ({response['jobId']}): {job.command}")
    listing = {"job_definition": definition["jobDefinitionArn"], "job_queue": args.job_queue, "jobs": submitted}
    client("s3", args.region).put_object(
        Bucket=args.bucket, Key=f"{args.prefix}/jobs.json", Body=json.dumps(listing, indent=1).encode()
    )
    print(
        f"{len(submitted)} jobs; their runs: python -m cleanrl_utils.submit fetch --bucket {args.bucket} "
        f"--prefix {args.prefix}"
    )
    return submitted


def keys(s3, bucket: str, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/")
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def download(s3, bucket: str, prefix: str, into: Path, flatten_jobs: bool = False) -> int:
    """Copy the files under s3://bucket/prefix/runs/ (each job's, with flatten_jobs) into `into`; returns how many."""
    count = 0
    for key in keys(s3, bucket, prefix):
        relative = key[len(prefix.rstrip("/")) + 1 :].split("/")
        if flatten_jobs:
            relative = relative[1:]  # drop the job folder: every job's runs land in one runs/
        if len(relative) < 3 or relative[0] != "runs":
            continue
        target = into.joinpath(*relative[1:])
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(target))
        count += 1
    return count


def upload(s3, bucket: str, prefix: str, runs_dir: Path) -> int:
    files = [path for path in sorted(runs_dir.rglob("*")) if path.is_file()] if runs_dir.is_dir() else []
    for path in files:
        s3.upload_file(str(path), bucket, f"{prefix}/runs/{path.relative_to(runs_dir).as_posix()}")
    return len(files)


def run_job(args: argparse.Namespace) -> int:
    """In the container: runs/ from S3, the command through the benchmark runner, runs/ back to S3."""
    s3 = client("s3", args.region)
    runs_dir = Path(args.runs_dir)
    print(f"{download(s3, args.bucket, args.prefix, runs_dir)} files of earlier attempts restored into {runs_dir}")
    runner = [sys.executable, "-m", "cleanrl_utils.benchmark", "--env-ids", args.env_id, "--start-seed"]
    runner += [str(args.seed), "--num-seeds", "1", "--runs-dir", str(runs_dir), "--command", shlex.join(args.command)]
    # Batch stops a job with SIGTERM to this process alone: pass it to the runner and its run (one process group),
    # which write their checkpoint and exit; then upload.
    process = subprocess.Popen(runner, start_new_session=True)
    signal.signal(signal.SIGTERM, lambda signum, frame: os.killpg(process.pid, signal.SIGTERM))
    code = process.wait()
    print(f"{upload(s3, args.bucket, args.prefix, runs_dir)} files uploaded to s3://{args.bucket}/{args.prefix}/runs")
    return code


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["job"], ["fetch"]):
        parser = argparse.ArgumentParser(prog=f"python -m cleanrl_utils.submit {argv[0]}")
        parser.add_argument("--bucket", required=True)
        parser.add_argument("--prefix", required=True)
        parser.add_argument("--region", default=None)
        parser.add_argument("--runs-dir", default="runs")
        if argv[0] == "job":
            parser.add_argument("--env-id", required=True)
            parser.add_argument("--seed", type=int, required=True)
            parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
            args = parser.parse_args(argv[1:])
            args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not args.command:
                fail("job needs the command after --")
            raise SystemExit(run_job(args))
        args = parser.parse_args(argv[1:])
        count = download(client("s3", args.region), args.bucket, args.prefix, Path(args.runs_dir), flatten_jobs=True)
        if not count:
            fail(f"nothing under s3://{args.bucket}/{args.prefix}/*/runs/")
        print(f"{count} files of s3://{args.bucket}/{args.prefix} in {args.runs_dir}/")
        return

    parser = argparse.ArgumentParser(
        prog="python -m cleanrl_utils.submit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env-ids", nargs="+", required=True, help="environment ids to run the command on")
    parser.add_argument("--command", required=True, help='e.g. "python cleanrl/ppo.py --total-timesteps 500000"')
    parser.add_argument("--num-seeds", type=int, default=3, help="seeds per environment (default 3)")
    parser.add_argument("--start-seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--image", required=True, help="the container image (built from the repository's Dockerfile)")
    parser.add_argument("--job-queue", required=True, help="the Batch job queue")
    parser.add_argument("--bucket", required=True, help="the S3 bucket the runs go to")
    parser.add_argument("--prefix", required=True, help="the folder in the bucket for this grid")
    parser.add_argument("--vcpus", type=int, default=2, help="vCPUs per job (default 2)")
    parser.add_argument("--memory", type=int, default=7000, help="memory per job in MiB (default 7000)")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs per job (default 0)")
    parser.add_argument("--hours", type=float, default=24.0, help="time limit of one attempt (default 24)")
    parser.add_argument("--attempts", type=int, default=3, help="attempts when the host is reclaimed (default 3)")
    parser.add_argument(
        "--job-role", default=None, help="the IAM role ARN the jobs run as (benchmark/cloud/batch.yaml's JobRole)"
    )
    parser.add_argument("--region", default=None, help="the AWS region (default: boto3's configuration)")
    args = parser.parse_args(argv)
    for name in ("num_seeds", "vcpus", "memory", "hours"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.gpus < 0 or not 1 <= args.attempts <= 10:
        fail(f"--gpus must be >= 0 and --attempts in 1..10 (Batch's limit), got {args.gpus} and {args.attempts}")
    try:
        words = shlex.split(args.command)
    except ValueError as error:
        fail(f"--command {args.command!r} cannot be parsed: {error}")
    if not any(word.endswith(".py") for word in words) or {"--env-id", "--seed"} & set(words):
        fail(f"--command must run a script and leave --env-id and --seed to the grid, got {args.command!r}")
    args.prefix = args.prefix.strip("/")
    submit(args)


if __name__ == "__main__":
    main()
