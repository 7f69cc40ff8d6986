"""Which CUDA widely used GPU images carry, by release: data, each row with its source.

The rules of :mod:`webhook.gpu.images` read tags; these rows say what a
tag cannot: the CUDA base an image project builds a release on (its
Dockerfile at the release tag, or its release notes). A row names the
repositories (``registry/path``, Docker Hub as ``docker.io/...``), a regular
expression the whole tag must match (group 1, when there is one, is the
release), the releases it covers (inclusive, compared number by number;
empty: every tag the expression matches), the CUDA version and where that
was read. Only rows with a source belong here: a guess would turn into a
false denial. A policy adds its own images with ``cudaDriver.images``.

``NO_CUDA`` lists images that carry no CUDA at all (distribution bases,
language runtimes, tools): a container running one cannot need a newer
driver, so it is "no CUDA" rather than "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    """The CUDA of a range of an image project's releases."""

    name: str
    repositories: tuple[str, ...]
    tag: str
    first: str
    last: str
    cuda: str
    source: str
    #: the image's NVIDIA_REQUIRE_CUDA when its source shows it (forward-compatible branches)
    require: str = ""


_NGC_NOTES = "NGC framework / Triton release notes, FACTS.md §4"
_TF_BUILDS = "tensorflow.org/install/source#gpu, tested build configurations (Linux GPU)"
_TGI = "github.com/huggingface/text-generation-inference Dockerfile at tag v{}: FROM nvidia/cuda:{}-base-… AS base"
_VALIDATOR = "github.com/NVIDIA/gpu-operator validator/Dockerfile + CUDA_VERSION in versions.mk (validator/Makefile) at tag {}"

#: NGC framework repositories whose YY.MM tags follow one release table.
NGC_FRAMEWORKS = (
    "pytorch", "tensorflow", "tritonserver", "nemo", "jax", "paddlepaddle", "mxnet", "tensorrt", "cuda-dl-base", "dgl",
)
NGC_REPOSITORIES = tuple(f"nvcr.io/nvidia/{name}" for name in NGC_FRAMEWORKS)

#: NGC release ranges (first, last, CUDA), FACTS.md §4 (NGC/Triton release notes).
NGC_RELEASES: tuple[tuple[str, str, str], ...] = (
    ("22.01", "22.02", "11.6.0"),
    ("22.03", "22.03", "11.6.1"),
    ("22.04", "22.04", "11.6.2"),
    ("22.05", "22.05", "11.7.0"),
    ("22.06", "22.08", "11.7.1"),
    ("22.09", "22.12", "11.8.0"),
    ("23.01", "23.02", "12.0.1"),
    ("23.03", "23.04", "12.1.0"),
    ("23.05", "23.07", "12.1.1"),
    ("23.08", "23.09", "12.2.1"),
    ("23.10", "23.10", "12.2.2"),
    ("23.11", "23.11", "12.3.0"),
    ("23.12", "24.02", "12.3.2"),
    ("24.03", "24.03", "12.4.0"),
    ("24.04", "24.05", "12.4.1"),
    ("24.06", "24.06", "12.5.0"),
    ("24.07", "24.07", "12.5.1"),
    ("24.08", "24.08", "12.6.0"),
    ("24.09", "24.09", "12.6.1"),
    ("24.10", "24.10", "12.6.2"),
    ("24.11", "24.12", "12.6.3"),
    ("25.01", "25.02", "12.8.0"),
    ("25.03", "25.03", "12.8.1"),
    ("25.04", "25.05", "12.9.0"),
    ("25.06", "25.07", "12.9.1"),
    ("25.08", "25.08", "13.0.0"),
    ("25.09", "25.09", "13.0.1"),
    ("25.10", "25.11", "13.0.2"),
    ("25.12", "25.12", "13.1.0"),
)

#: tensorflow/tensorflow:<X.Y>[.Z]-gpu ranges (first, last, CUDA) before 2.11: the
#: tested build configurations (the GPU images are built on that CUDA).
TENSORFLOW_TESTED_BUILDS: tuple[tuple[str, str, str], ...] = (
    ("1.0", "1.4", "8.0"),
    ("1.5", "1.12", "9.0"),
    ("1.13", "1.15", "10.0"),
    ("2.0", "2.0", "10.0"),
    ("2.1", "2.3", "10.1"),
    ("2.4", "2.4", "11.0"),
    ("2.5", "2.10", "11.2"),
)

#: tensorflow/tensorflow:<X.Y>[.Z]-gpu ranges (first, last, CUDA), FACTS.md §4.
TENSORFLOW_RELEASES: tuple[tuple[str, str, str], ...] = (
    ("2.11", "2.11", "11.2"),
    ("2.12", "2.14", "11.8"),
    ("2.15", "2.15", "12.2"),
    ("2.16", "2.17", "12.3"),
    ("2.18", "2.19", "12.5"),
)

#: nvidia/cuda X.Y.Z → the ``brand=tesla`` branches of its NVIDIA_REQUIRE_CUDA, the ones every
#: revision of gitlab.com/nvidia/container-images/cuda dist/<X.Y.Z>/*/base/Dockerfile seen
#: (as copied, with that path, into public Dockerfiles) lists. Its cuda-compat runs it there.
NVIDIA_CUDA_REQUIRE: dict[str, str] = {
    "11.8.0": "cuda>=11.8 brand=tesla,driver>=470,driver<471",
    "12.1.1": "cuda>=12.1 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=525,driver<526",
    "12.2.2": "cuda>=12.2 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=525,driver<526",
    "12.4.1": "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=525,driver<526 "
              "brand=tesla,driver>=535,driver<536",
}

_NGC_TAG = r"(\d{2}\.\d{2})(?:\.\d+)?(?:-.*)?"
_TF_TAG = r"(\d+\.\d+)(?:\.\d+)?(?:rc\d+)?-gpu(?:-.*)?"
_SEMVER = r"v?(\d+\.\d+\.\d+)"
_TENSORFLOW = ("docker.io/tensorflow/tensorflow",)
_RAY_ML = ("docker.io/rayproject/ray-ml",)
_RAY_ML_TAG = r"(\d+\.\d+\.\d+)(?:\.[0-9a-f]{6})?(?:-py\d+)?(?:-gpu)?"

RELEASES: tuple[Release, ...] = (
    *(Release("NGC", NGC_REPOSITORIES, _NGC_TAG, a, b, c, _NGC_NOTES) for a, b, c in NGC_RELEASES),
    *(Release("TensorFlow", _TENSORFLOW, _TF_TAG, a, b, c, _TF_BUILDS) for a, b, c in TENSORFLOW_TESTED_BUILDS),
    *(Release("TensorFlow", _TENSORFLOW, _TF_TAG, a, b, c, "FACTS.md §4") for a, b, c in TENSORFLOW_RELEASES),
    Release("TGI", ("ghcr.io/huggingface/text-generation-inference",), _SEMVER, "0.7.0", "1.1.1", "11.8.0",
            _TGI.format("0.7.0…1.1.1", "11.8.0")),
    Release("TGI", ("ghcr.io/huggingface/text-generation-inference",), _SEMVER, "1.2.0", "3.1.0", "12.1.0",
            _TGI.format("1.2.0…3.1.0", "12.1.0")),
    Release("TGI", ("ghcr.io/huggingface/text-generation-inference",), _SEMVER, "3.1.1", "3.3.7", "12.4.0",
            _TGI.format("3.1.1…3.3.7", "12.4.0")),
    *(
        Release("vLLM", ("docker.io/vllm/vllm-openai",), r"v(\d+\.\d+\.\d+)(?:\.post\d+)?", a, b, c, source)
        for a, b, c, source in (
            ("0.5.0", "0.8.5", "12.4",
             "vllm-project/vllm issue #5635 (the 0.5.0 image requires cuda>=12.4; maintainers: built on 12.4) "
             "and the v0.9.0 release notes (default moved from CUDA 12.4 to 12.8)"),
            ("0.9.0", "0.10.2", "12.8",
             "vLLM v0.9.0 release notes (PR #16859: release pipeline on CUDA 12.8); issue #18813 (the 0.9.0 "
             "image's NVIDIA_REQUIRE_CUDA is cuda>=12.8)"),
            ("0.20.0", "0.27.1", "13.0",
             "vllm-project/vllm issue #42738 (after v0.20.0 the default wheel and docker image are cu130); "
             "NVIDIA-NeMo/labs-molt PR #77 (0.27.1: CUDA 13.0 is vLLM's default pairing)"),
            ("0.28.0", "0.28.0", "13.0",
             "vllm-project/vllm docker/Dockerfile at v0.28.0 (2cf0a69, the release commit per coreweave/ml-containers "
             "PR #218): ARG CUDA_VERSION=13.0.3, final stage FROM nvidia/cuda:${CUDA_VERSION}-base-ubuntu24.04; "
             "PR #39878 (2026-04): the unsuffixed docker tags are CUDA 13.0"),
        )
    ),
    *(
        Release("GPU Operator validator", ("nvcr.io/nvidia/cloud-native/gpu-operator-validator",), r"v(\d+\.\d+\.\d+)",
                a, b, c, _VALIDATOR.format(f"v{a}…v{b}"))
        for a, b, c in (
            ("1.8.0", "1.8.2", "11.4.1"), ("1.9.0", "1.9.1", "11.4.2"), ("1.10.0", "1.11.0", "11.6.0"),
            ("1.11.1", "1.11.1", "11.7.0"), ("22.9.0", "22.9.0", "11.7.1"), ("22.9.1", "22.9.2", "11.8.0"),
            ("23.3.0", "23.3.1", "12.1.0"), ("23.3.2", "23.3.2", "12.1.1"), ("23.6.0", "23.6.1", "12.2.0"),
            ("23.6.2", "23.6.2", "12.3.1"), ("23.9.0", "23.9.0", "12.2.2"), ("23.9.1", "23.9.1", "12.3.1"),
            ("23.9.2", "23.9.2", "12.3.2"), ("24.3.0", "24.3.0", "12.4.1"),
        )
    ),
    Release("cuda-vector-add", ("k8s.gcr.io/cuda-vector-add", "registry.k8s.io/cuda-vector-add"), r"v0\.1", "", "", "8.0",
            "github.com/kubernetes/kubernetes test/images/nvidia-cuda/Dockerfile: FROM nvidia/cuda:8.0-devel-ubuntu16.04"),
    Release("BytePS", ("docker.io/bytepsimage/mxnet", "docker.io/bytepsimage/tensorflow", "docker.io/bytepsimage/pytorch"),
            r"(?:latest)?", "", "", "10.0",
            "github.com/bytedance/byteps docker/README.md + docker/Dockerfile (every version): FROM nvidia/cuda:10.0-…"),
    Release("MPI Operator example", ("docker.io/mpioperator/tensorflow-benchmarks",), r"(?:latest)?", "", "", "10.1",
            "github.com/kubeflow/mpi-operator examples/v2beta1/tensorflow-benchmarks/Dockerfile (since 2022-02): "
            "FROM horovod/horovod:0.20.0-tf2.3.0-torch1.6.0-mxnet1.6.0.post0-py3.7-cuda10.1"),
    Release("HAMi benchmark", ("docker.io/4pdosc/ai-benchmark",), r"2\.4\.1-gpu", "", "", "11.0",
            "github.com/Project-HAMi/HAMi benchmarks/ai-benchmark/Dockerfile (2021-10, 00e0a1d, the image its "
            "benchmark jobs ran until 2026-04): FROM tensorflow/tensorflow:2.4.1-gpu; TensorFlow 2.4: " + _TF_BUILDS),
    Release("vLLM UBI9 (rh-aiservices-bu)", ("quay.io/rh-aiservices-bu/vllm-openai-ubi9",), r"0\.4\.2", "", "", "12.1.1",
            "github.com/rh-aiservices-bu/llm-on-openshift llm-servers/vllm/Containerfile at 3330f03 (vLLM update to "
            "0.4.2): CUDA 12.1.1 layer with cuda-compat-12-1",
            require="cuda>=12.1 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=525,driver<526"),
    Release("Training Operator example", ("docker.io/kubeflow/pytorch-deepspeed-demo",), r"(?:latest)?", "", "", "11.7",
            "github.com/kubeflow/training-operator examples/pytorch/deepspeed-demo/Dockerfile (its only version): "
            "FROM deepspeed/deepspeed:v072_torch112_cu117"),
    # -gpu (and, for ray-ml, no platform suffix) aliases the release's default -cuXX build; release
    # builds are also tagged <release>.<commit>: 2.46.0.0e19ea-py311-gpu
    Release("Ray ML", _RAY_ML, _RAY_ML_TAG, "1.9.0", "2.0.1", "11.2.0",
            "ray-project/ray ci/build/build-docker-images.py (ci/travis/ before 2022-04) on master from db863aa "
            "(#19763, 2021-10-26) to at least 6fb6053 (2022-10-14): ML_CUDA_VERSION = cu112, "
            "nvidia/cuda:11.2.0-cudnn8-devel; ray-ml is built for it (and cpu) only, its -gpu and platform-less "
            "tags alias it (#19505: 'gpu will refer to cu112'); the releases branched in that window"),
    Release("Ray ML", _RAY_ML, _RAY_ML_TAG, "2.46.0", "2.47.1", "12.1.1",
            "ray-project/ray issue #54102 (2025-07-02, after 2.47.1; maintainer: -gpu is the default CUDA, "
            "'(still) pointing to 12.1', base nvidia/cuda:12.1.1-cudnn8-devel-ubuntu20.04) and "
            "ci/ray_ci/docker_container.py before CUDA 12.4 joined the matrix (PR #50005, 2025-01): ray-ml built "
            "for cpu and cu12.1.1-cudnn8 only, GPU_PLATFORM = cu12.1.1-cudnn8 tagged -gpu; docker/ray-ml/README.md: "
            "no platform tag is -gpu",
            require=NVIDIA_CUDA_REQUIRE["12.1.1"]),
    Release("gpu-burn (oguzpastirmaci)", ("docker.io/oguzpastirmaci/gpu-burn",), r"(?:latest)?", "", "", "11.1.1",
            "github.com/OguzPastirmaci/gpu-burn Dockerfile since 2022-12-02 (0b92981, the repository's last "
            "commit; its README names this image): FROM nvidia/cuda:11.1.1-runtime (nvidia/cuda:9.0-devel before)"),
    Release("MPI Operator NCCL tests", ("docker.io/mpioperator/nccl-tests",), r"(?:latest)?", "", "", "12.4.1",
            "github.com/kubeflow/mpi-operator PR #640 (6dcc0f7, 2024-04-30, unmerged), the change whose "
            "examples/v2beta1/nccl-tests/nccl-tests.yaml names this image, builds it from the Dockerfile beside it: "
            "FROM nvidia/cuda:12.4.1-devel-ubuntu22.04 (libnccl2 2.21.5-1+cuda12.4)",
            require=NVIDIA_CUDA_REQUIRE["12.4.1"]),
)

#: Repositories (globs over ``registry/path``) of images that carry no CUDA.
NO_CUDA: tuple[str, ...] = (
    *(f"docker.io/library/{name}" for name in (
        "alpine", "busybox", "ubuntu", "debian", "centos", "fedora", "rockylinux", "almalinux", "amazonlinux",
        "oraclelinux", "opensuse", "archlinux", "python", "golang", "node", "openjdk", "eclipse-temurin", "ruby",
        "perl", "php", "rust", "bash", "nginx", "httpd", "redis", "postgres", "mysql", "memcached", "curlimages",
    )),
    "docker.io/curlimages/curl",
    "docker.io/bitnami/kubectl",
    "registry.k8s.io/pause",
    "k8s.gcr.io/pause",
    "gcr.io/distroless/*",
    "registry.access.redhat.com/ubi*",
    "registry.redhat.io/ubi*",
    "quay.io/centos/centos",
    "docker.io/rocm/*",  # AMD ROCm images: HIP, not CUDA
)
