"""Smoke check of a torchvision install beside a CPU torch (README.md here): ops, transforms, io, processors."""

import importlib

import torch
import torchvision
import transformers
from PIL import Image
from torchvision.io import decode_png, encode_png
from torchvision.ops import nms, roi_align
from torchvision.transforms.v2 import functional as F

print("torch", torch.__version__, "torchvision", torchvision.__version__, "transformers", transformers.__version__)
print("has_ops", torchvision.extension._has_ops(), "cuda", torch.cuda.is_available(), torch.cuda.device_count())
boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]], dtype=torch.float32)
print("nms", nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist())  # box 1 overlaps box 0 (IoU 0.68): [0, 2]
print("roi_align", roi_align(torch.arange(16.0).view(1, 1, 4, 4), [torch.tensor([[0.0, 0.0, 3.0, 3.0]])], 2).shape)
img = torch.randint(0, 255, (3, 100, 80), dtype=torch.uint8)
print("resize", F.resize(img, [64, 64]).shape)
print("png roundtrip", bool((decode_png(encode_png(img)) == img).all()))
for name in ("gemma3", "pixtral", "qwen2_vl", "idefics3"):  # the processors that import torchvision
    importlib.import_module(f"transformers.models.{name}.image_processing_{name}")
qwen = importlib.import_module("transformers.models.qwen2_vl.image_processing_qwen2_vl").Qwen2VLImageProcessor
out = qwen()(images=[Image.new("RGB", (64, 64))], return_tensors="pt")
print("qwen2vl processor", out["pixel_values"].shape, out["image_grid_thw"].tolist())
