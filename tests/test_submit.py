"""cleanrl_utils.submit against moto's AWS Batch and S3, served by a local moto server so that a job runs as the
container runs it: a process of its own (`python -m cleanrl_utils.submit job ...`), stopped by a SIGTERM to it alone.
moto's Batch without Docker records the jobs and runs none of them: the test runs each job's command itself."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from conftest import ROOT, assert_bad_input, read_scalars, script_env
from moto.core.models import default_user_config
from moto.server import ThreadedMotoServer

from cleanrl_utils import submit

BUCKET = "runs-bucket"
TINY = "--num-envs 2 --num-steps 32 --num-minibatches 2 --update-epochs 1 --checkpoint-every 64"


@pytest.fixture(scope="module")
def aws():
    """A moto server; the environment variables that point boto3 (here and in a job's process) at it."""
    default_user_config["batch"] = {"use_docker": False}  # jobs are recorded, not run in containers
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = dict(
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    yield env
    for key, value in saved.items():
        os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    server.stop()


@pytest.fixture(scope="module")
def job_queue(aws) -> str:
    role = boto3.client("iam").create_role(RoleName="batch", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    batch = boto3.client("batch")
    environment = batch.create_compute_environment(
        computeEnvironmentName="cleanrl", type="UNMANAGED", state="ENABLED", serviceRole=role
    )
    batch.create_job_queue(
        jobQueueName="cleanrl",
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": environment["computeEnvironmentArn"]}],
    )
    return "cleanrl"


def submit_flags(command: str, prefix: str) -> list[str]:
    return (
        ["--env-ids", "CartPole-v1", "Acrobot-v1", "--command", command, "--num-seeds", "2", "--image"]
        + ["example.com/cleanrl:1", "--job-queue", "cleanrl", "--bucket", BUCKET, "--prefix", prefix, "--vcpus", "4"]
        + ["--memory", "15000", "--gpus", "1", "--hours", "2"]
    )


def test_the_grid_becomes_one_batch_job_per_environment_and_seed(job_queue, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    command = "python cleanrl/ppo.py --total-timesteps 50000 --track"
    submit.main(submit_flags(command, "grid"))
    listing = json.loads(boto3.client("s3").get_object(Bucket=BUCKET, Key="grid/jobs.json")["Body"].read())
    batch = boto3.client("batch")
    jobs = batch.describe_jobs(jobs=[job["job_id"] for job in listing["jobs"]])["jobs"]
    assert len(jobs) == 4 and capsys.readouterr().out.count("submitted ppo-") == 4
    for (env_id, seed), job in zip([(e, s) for e in ("CartPole-v1", "Acrobot-v1") for s in (1, 2)], jobs):
        assert job["jobName"] == f"ppo-{env_id}__{seed}" and job["jobQueue"].endswith("job-queue/cleanrl")
        inner = [
            "python",
            "-m",
            "cleanrl_utils.submit",
            "job",
            "--bucket",
            BUCKET,
            "--prefix",
            f"grid/{env_id}__{seed}",
        ]
        inner += [
            "--env-id",
            env_id,
            "--seed",
            str(seed),
            "--",
            "python",
            "cleanrl/ppo.py",
            "--total-timesteps",
            "50000",
        ]
        assert job["container"]["command"] == [*inner, "--track"]
        assert {"name": "WANDB_API_KEY", "value": "k" * 40} in job["container"]["environment"]
    (definition,) = batch.describe_job_definitions(jobDefinitions=[listing["job_definition"]])["jobDefinitions"]
    assert definition["containerProperties"]["image"] == "example.com/cleanrl:1"
    resources = {r["type"]: r["value"] for r in definition["containerProperties"]["resourceRequirements"]}
    assert resources == {"VCPU": "4", "MEMORY": "15000", "GPU": "1"}
    assert definition["timeout"] == {"attemptDurationSeconds": 7200}
    assert definition["retryStrategy"]["attempts"] == 3  # retried when the host is reclaimed, not on a failure
    rule = definition["retryStrategy"]["evaluateOnExit"][0]  # (Batch reads actions in any case)
    assert rule["onStatusReason"] == "Host EC2*" and rule["action"].upper() == "RETRY"


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--command", "python cleanrl/ppo.py --seed 3"], "leave --env-id and --seed to the grid"),
        (["--command", "echo hi"], "must run a script"),
        (["--command", "python cleanrl/ppo.py", "--hours", "0"], "--hours must be positive"),
        (["--command", "python cleanrl/ppo.py", "--attempts", "11"], "--attempts in 1..10"),
    ],
)
def test_bad_arguments_stop_in_one_line_before_anything_is_submitted(flags, fragment, tmp_path):
    grid = ["--env-ids", "CartPole-v1", "--image", "i", "--job-queue", "q", "--bucket", BUCKET, "--prefix", "bad"]
    env = script_env(AWS_ENDPOINT_URL="http://127.0.0.1:9")  # nothing listens there: any AWS call would fail loudly
    result = subprocess.run(
        [sys.executable, "-m", "cleanrl_utils.submit", *grid, *flags],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert_bad_input(result, tmp_path, fragment)


def start_job(cwd: Path, prefix: str, total: int, aws: dict) -> subprocess.Popen:
    command = [sys.executable, "-m", "cleanrl_utils.submit", "job", "--bucket", BUCKET, "--prefix", prefix]
    command += ["--env-id", "CartPole-v1", "--seed", "1", "--", sys.executable, str(ROOT / "cleanrl" / "ppo.py")]
    command += [*TINY.split(), "--total-timesteps", str(total)]
    cwd.mkdir()
    return subprocess.Popen(command, cwd=cwd, env=script_env(**aws), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_a_job_stopped_by_sigterm_uploads_its_checkpoint_and_the_next_attempt_finishes_the_run(aws, tmp_path):
    """Batch stops a job (a reclaimed spot host) with SIGTERM to its process; the retry runs on a fresh host."""
    first = start_job(tmp_path / "host1", "attempts/CartPole-v1__1", 6000, aws)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "host1").glob("runs/*/checkpoint.pt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    output = first.communicate(timeout=120)[0].decode()
    assert first.returncode == 128 + signal.SIGTERM, output
    assert "0 files of earlier attempts restored" in output and "files uploaded to s3://" in output
    s3 = boto3.client("s3")
    stored = submit.keys(s3, BUCKET, "attempts/CartPole-v1__1")
    assert any(key.endswith("/checkpoint.pt") for key in stored), stored
    assert not any(key.endswith("/finished.json") for key in stored), "the first attempt was stopped early"

    second = start_job(tmp_path / "host2", "attempts/CartPole-v1__1", 6000, aws)
    output = second.communicate(timeout=300)[0].decode()
    assert second.returncode == 0, output[-3000:]
    assert "--resume runs/" in output  # the runner continued the first attempt's run from its checkpoint
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "cleanrl_utils.submit", "fetch", "--bucket", BUCKET, "--prefix", "attempts"],
        cwd=fetched,
        env=script_env(**aws),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = sorted((fetched / "runs").iterdir())  # one run, continued: not a second one
    assert (run_dir / "finished.json").is_file()
    steps = [step for step, _ in read_scalars(run_dir)["charts/learning_rate"]]
    assert steps == list(range(64, 6001, 64))  # one curve, every iteration once: the second attempt went on


def test_the_queue_template_deploys_and_takes_the_grid(aws):
    """benchmark/cloud/batch.yaml deployed on moto's CloudFormation; the grid submitted to the queue it made."""
    ec2 = boto3.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="cleanrl", Description="jobs", VpcId=vpc)["GroupId"]
    cloudformation = boto3.client("cloudformation")
    cloudformation.create_stack(
        StackName="cleanrl",
        TemplateBody=(ROOT / "benchmark" / "cloud" / "batch.yaml").read_text(),
        Parameters=[
            {"ParameterKey": "SubnetIds", "ParameterValue": subnet},
            {"ParameterKey": "SecurityGroupIds", "ParameterValue": group},
            # given, not left to their defaults: moto does not split a list parameter's default
            {"ParameterKey": "InstanceTypes", "ParameterValue": "g5.xlarge,g6.xlarge"},
            {"ParameterKey": "MaxvCpus", "ParameterValue": "64"},
        ],
        Capabilities=["CAPABILITY_IAM"],
    )
    (stack,) = cloudformation.describe_stacks(StackName="cleanrl")["Stacks"]
    assert stack["StackStatus"] == "CREATE_COMPLETE", stack
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
    flags = ["--env-ids", "CartPole-v1", "--num-seeds", "1", "--command", "python cleanrl/ppo.py", "--image", "img"]
    flags += ["--job-queue", outputs["JobQueue"], "--bucket", outputs["Bucket"], "--prefix", "stack"]
    submit.main([*flags, "--job-role", outputs["JobRole"]])
    listing = json.loads(boto3.client("s3").get_object(Bucket=outputs["Bucket"], Key="stack/jobs.json")["Body"].read())
    batch = boto3.client("batch")
    (job,) = batch.describe_jobs(jobs=[listing["jobs"][0]["job_id"]])["jobs"]
    assert job["jobQueue"] == outputs["JobQueue"] or job["jobQueue"].endswith(outputs["JobQueue"].split("/")[-1])
    (definition,) = batch.describe_job_definitions(jobDefinitions=[listing["job_definition"]])["jobDefinitions"]
    assert definition["containerProperties"]["jobRoleArn"] == outputs["JobRole"]


def test_the_image_installs_what_ci_installs():
    """The Dockerfile (not built here: this machine reaches no container registry) installs .ci/run's system packages
    and the lock's packages with every extra, on the Python the tests run on, compiled to bytecode at build time only
    (UV_COMPILE_BYTECODE left in the image's environment would make every `uv run` recompile everything)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    (ci_packages,) = re.findall(r'system_packages="([^"]+)"', (ROOT / ".ci" / "run").read_text())
    (apt_line,) = [line for line in dockerfile.splitlines() if line.strip().startswith("libegl1")]
    assert apt_line.replace("\\", " ").split() == ci_packages.split()
    assert "RUN uv sync --frozen --all-extras --no-dev --compile-bytecode\n" in dockerfile
    assert not [line for line in dockerfile.splitlines() if line.startswith("ENV") and "UV_COMPILE_BYTECODE" in line]
    assert f"FROM python:{sys.version_info.major}.{sys.version_info.minor}-" in dockerfile
