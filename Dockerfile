# Kernel Porter: one image for the compile workers, the GPU workers and the dashboard.
# NVRTC and the CUDA driver bindings come from PyPI; the GPU workers get the driver from the
# NVIDIA container toolkit at run time (no CUDA toolkit in the image).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PORTER_CACHE_DIR=/var/cache/kernel-porter
WORKDIR /app
COPY pyproject.toml README.md ./
COPY porter ./porter
COPY db ./db
COPY workers ./workers
COPY search_spaces ./search_spaces
COPY dashboard ./dashboard
RUN pip install ".[service,dashboard,gpu]" && mkdir -p "$PORTER_CACHE_DIR"
RUN useradd --create-home porter && chown porter "$PORTER_CACHE_DIR"
USER porter
ENTRYPOINT ["porter"]
CMD ["--help"]
