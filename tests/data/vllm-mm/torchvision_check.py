"""Smoke check of a torchvision install beside a CPU torch (README.md here): ops, transforms, io, processors."""
import torch, torchvision, transformers
from torchvision.ops import nms, roi_align
from torchvision.transforms.v2 import functional as F
print("torch", torch.__version__, "torchvision", torchvision.__version__, "transformers", transformers.__version__)
print("has_ops", torchvision.extension._has_ops(), "cuda", torch.cuda.is_available(), torch.cuda.device_count())
boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]], dtype=torch.float32)
print("nms", nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist())  # box 1 overlaps box 0 (IoU 0.68): [0, 2]
print("roi_align", roi_align(torch.arange(16.).view(1, 1, 4, 4), [torch.tensor([[0., 0., 3., 3.]])], 2).shape)
img = torch.randint(0, 255, (3, 100, 80), dtype=torch.uint8)
print("resize", F.resize(img, [64, 64]).shape)
from torchvision.io import decode_png, encode_png
print("png roundtrip", bool((decode_png(encode_png(img)) == img).all()))
from transformers.models.gemma3.image_processing_gemma3 import Gemma3ImageProcessor
from transformers.models.pixtral.image_processing_pixtral import PixtralImageProcessor
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
from transformers.models.idefics3.image_processing_idefics3 import Idefics3ImageProcessor
from PIL import Image
out = Qwen2VLImageProcessor()(images=[Image.new("RGB", (64, 64))], return_tensors="pt")
print("qwen2vl processor", out["pixel_values"].shape, out["image_grid_thw"].tolist())
