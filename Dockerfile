# One image for every service role: compile worker, GPU worker, dashboard.
# The CUDA runtime comes from the host driver through the NVIDIA container toolkit; NVRTC and
# cuda-bindings come from PyPI wheels.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PORTER_CACHE_DIR=/cache \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

WORKDIR /app
COPY pyproject.toml README.md ./
COPY porter ./porter
COPY db ./db
COPY workers ./workers
COPY dashboard ./dashboard
COPY search_spaces ./search_spaces
RUN pip install ".[service,dashboard,gpu]" && mkdir -p /cache

# workers run as an unprivileged user
RUN useradd --create-home --uid 1000 porter && chown porter /cache
USER porter

ENTRYPOINT ["porter"]
CMD ["--help"]
