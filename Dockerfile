# YOLO trainer for CUDA hosts: torch, torchvision, CUDA, cuDNN and NCCL come from the official PyTorch image.
#   docker build -t yolo-ddp .
#   docker run --gpus all --ipc=host -v "$PWD/datasets:/usr/src/datasets" yolo-ddp \
#       torchrun --nproc_per_node 8 train.py --data coco128.yaml --batch-size 64
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

# Shared libraries OpenCV loads (libGL, GLib). Distribution versions are not pinned: the base tag fixes the
# Ubuntu release and its security updates should apply.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgl1 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/*

# Datasets (the synthetic set, coco128 downloads) go to /usr/src/datasets: mount a host folder there to keep them.
# TORCH_DISABLE_SHARE_RDZV_TCP_STORE: a node may join an elastic torchrun job (docs/cluster.md).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    YOLO_DATA_DIR=/usr/src/datasets \
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1

WORKDIR /usr/src/app

# Requirements before the code, so this layer is reused when only the code changes. torch and torchvision are
# filtered out: the image's CUDA builds must stay, not be replaced by a download from PyPI.
COPY requirements.txt .
RUN grep -vE '^(torch|torchvision)([<>=!~ ;[]|$)' requirements.txt > /tmp/requirements-image.txt \
    && pip install --no-cache-dir -r /tmp/requirements-image.txt \
    && rm /tmp/requirements-image.txt

# The whole project tree; .dockerignore keeps history, tests, run outputs, data sets, caches and weights out.
# Its bytecode is compiled into the image: PYTHONDONTWRITEBYTECODE stops Python from writing it at run time, so
# without it every process (each torchrun rank) would compile the project's modules again as it starts.
COPY . .
RUN python -m compileall -q .

CMD ["python", "train.py", "--help"]
