#!/usr/bin/env bash
# The GPU check, in one go wherever a GPU is at hand (about 10 minutes on one H100): the whole suite with CUDA
# present (the CUDA tests run instead of skipping), the default run on the GPU, and a budget-20 search of a
# 224-pixel MobileNetV2 on a folder of 2,000 images, with the full-size costs of benchmarks/full_size.py at 1,000
# images. Each step's last lines go to stdout; everything to $OUT (default: runs/gpu-check).
#
#   bash benchmarks/gpu_check.sh                 # needs ../shared beside the checkout (CIFAR-10 JPEG test images)
set -uo pipefail
OUT=${OUT:-runs/gpu-check}
PY=${PY:-python}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__)"

echo "== the suite, CUDA present"
timeout 420 "$PY" -m pytest -q -n 8 -p no:cacheprovider >"$OUT/pytest.txt" 2>&1; echo "pytest exit $?"
tail -n 3 "$OUT/pytest.txt"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.txt" | head -n 20

echo "== the default run on the GPU"
timeout 300 "$PY" -m modelopt optimize --device cuda --out "$OUT/default" --no-progress >"$OUT/default.txt" 2>&1
echo "default run exit $?"; tail -n 12 "$OUT/default.txt"

echo "== a 224-pixel MobileNetV2 search, 2,000 images, budget 20"
"$PY" - "$OUT" <<'EOF'
import sys
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, "benchmarks")
from full_size import make_folder  # noqa: E402

out = Path(sys.argv[1])
make_folder(out / "folder224", 2000)
torch.manual_seed(0)
torch.save(torchvision.models.mobilenet_v2(num_classes=10).state_dict(), out / "mobilenet_v2-random.pt")
EOF
timeout 400 "$PY" -m modelopt optimize --model torchvision:mobilenet_v2 --weights "$OUT/mobilenet_v2-random.pt" \
  --data "$OUT/folder224" --budget 20 --device cuda --min-retention 0.9 --out "$OUT/mnv2-224" --no-progress \
  >"$OUT/mnv2.txt" 2>&1
echo "mobilenet_v2 search exit $?"; tail -n 12 "$OUT/mnv2.txt"

echo "== full-size costs on the GPU, 1,000 images"
timeout 300 "$PY" benchmarks/full_size.py --device cuda --images 1000 --cache "$OUT/folder224-fs"
