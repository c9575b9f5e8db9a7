# The image cleanrl_utils.submit's AWS Batch jobs run in: the repository in /app, every extra installed from uv.lock
# (CUDA torch: its wheels bring CUDA, the host brings the NVIDIA driver), the project's python first on PATH.
#   docker build -t cleanrl .      then push it where Batch pulls from (ECR) and pass it as --image
FROM python:3.11-slim-bookworm
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /uvx /usr/local/bin/
# The system libraries .ci/run installs: headless OpenGL for MuJoCo (EGL, Mesa), GLib for opencv, Qt 5 for Procgen.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libgles2 libglib2.0-0 libqt5gui5 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
ENV UV_LINK_MODE=copy MUJOCO_GL=egl SDL_VIDEODRIVER=dummy PYTHONUNBUFFERED=1
# The dependencies first (a layer that changes only with uv.lock), then the project; compiled to bytecode in the image
# (at build time only: a `uv run` with UV_COMPILE_BYTECODE set would recompile everything at each start).
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --all-extras --no-dev --no-install-project --compile-bytecode
COPY . .
RUN uv sync --frozen --all-extras --no-dev --compile-bytecode
ENV PATH="/app/.venv/bin:$PATH"
CMD ["python", "-m", "cleanrl_utils.submit", "--help"]
