"""Image models read in their own terms: a diffusion model's generation (Stable Diffusion web UIs, ComfyUI,
diffusers) whose attention is what grows with the resolution, an attention computation that ran out, flex attention
run without torch.compile, and the step of a vision network, whose size is images x resolution, not tokens."""

from __future__ import annotations

import re

from harness.diagnose.records import Change, Diagnosis

# a diffusion model's generation: AUTOMATIC1111's web UI (its COMMANDLINE_ARGS, --medvram/--lowvram, txt2img/img2img,
# its modules' paths), ComfyUI (-lowvram/-novram), diffusers' pipelines, the latent-diffusion code they run
_DIFFUSION = re.compile(r"stable[-_ ]?diffusion|stable-diffusion-webui|\bsd[-_]webui|\bwebui-user\b|COMMANDLINE_ARGS|"
                        r"-{1,2}(?:med|low|no)vram\b|\btxt2img\b|\bimg2img\b|comfy\s?ui|\bdiffusers\b|"
                        r"\w*Diffusion\w*Pipeline|\bsdxl\b|ldm[/\\.]modules|sd_hijack", re.I)
# a vision-language model reads images as tokens (harness.diagnose.pytorch's image-token rule): no diffusion model
_VISION_LANGUAGE = re.compile(r"qwen2?[-_.]?(?:\d[-_.]?\d?[-_]?)?vl|\bllava|internvl|\bVLM\b|-VL\b|pixel_values|"
                              r"max_pixels|image_processor|vision[-_ ]language", re.I)
# a picture and its size said in words or settings: "a picture at 1000x1000", "768 x 768", width/height
_IMAGE_SAID = re.compile(r"\b(?:picture|image|img|photo)s?\b", re.I)
_RESOLUTION = re.compile(r"\b(\d{3,4})\s*[x×]\s*(\d{3,4})\b")
LARGE_SIDE = 768  # px: from here a diffusion UNet's self-attention over (W/8 x H/8) latent pixels dominates its memory
# an attention computation in the traceback: the attention module's frames and the ops that build its scores
_ATTENTION_FRAMES = re.compile(r"File \"[^\"]*attention\w*\.py\"|\bbaddbmm\b|\bsoftmax\b|\beinsum\b|"
                               r"scaled_dot_product|\bsplit_cross_attention|sub_quadratic|cross_attention_forward|"
                               r"\battn_weights\b|\bq\s*@\s*k", re.I)
# a web UI's own cross-attention optimisation (AUTOMATIC1111's --opt-split-attention, Doggettx's, sub-quadratic,
# InvokeAI's): attention in chunks, still materialising each chunk's scores
_UI_CROSS_ATTENTION = re.compile(r"--opt-split-attention|--opt-sub-quad-attention|cross[- ]attention optimi[sz]ation|"
                                 r"doggettx|--opt-split-attention-v1", re.I)
# a memory-efficient kernel already on: xformers, PyTorch's SDPA (the web UI's --opt-sdp-attention), flash attention
_KERNEL_ON = re.compile(r"--xformers\b|--opt-sdp(?:-no-mem)?-attention|enable_xformers_memory_efficient_attention|"
                        r"xformers\s+(?:is\s+)?(?:on|enabled)|\bsdpa\b|scaled_dot_product|flash[-_ ]?attn|"
                        r"flash[-_ ]?attention|--use-pytorch-cross-attention|--use-split-cross-attention", re.I)
# --no-half: the web UI keeps the model in fp32, twice the bytes of its weights and activations
_NO_HALF = re.compile(r"--no-half(?![-\w])")


def _largest_side(context: str) -> int:
    return max((max(int(w), int(h)) for w, h in _RESOLUTION.findall(context)), default=0)


def image_generation(context: str) -> bool:
    """A diffusion model generating images: its UI or library named, or a picture with its size in pixels."""
    if _VISION_LANGUAGE.search(context):
        return False
    return bool(_DIFFUSION.search(context)) or (bool(_IMAGE_SAID.search(context)) and
                                                _largest_side(context) >= LARGE_SIDE)


def _kernel_change(context: str) -> Change:
    if re.search(r"COMMANDLINE_ARGS|\bwebui-user\b|stable-diffusion-webui|\bsd[-_]webui|-{1,2}(?:med|low)vram|"
                 r"txt2img|img2img|sd_hijack", context, re.I) and not re.search(r"comfy", context, re.I):
        setting = ("--xformers or --opt-sdp-attention in COMMANDLINE_ARGS (the web UI's memory-efficient "
                   "cross-attention)")
    elif re.search(r"comfy", context, re.I):
        setting = "ComfyUI with xformers installed, or --use-pytorch-cross-attention (PyTorch's SDPA)"
    elif re.search(r"diffusers|Pipeline", context):
        setting = ("pipe.enable_xformers_memory_efficient_attention() (or PyTorch 2's SDPA attention processor), "
                   "then pipe.enable_attention_slicing()")
    elif image_generation(context):
        setting = ("a memory-efficient attention kernel: xformers or PyTorch's SDPA (a web UI's --xformers / "
                   "--opt-sdp-attention, diffusers' enable_xformers_memory_efficient_attention())")
    else:
        setting = ("a memory-efficient attention kernel: PyTorch's scaled_dot_product_attention (attn_implementation="
                   "'sdpa'), xformers or flash attention")
    return Change(setting, "the attention scores (latent pixels squared, per head) are never held whole: attention "
                  "memory grows with the pixels, not their square", "attention_kernel")


def attention_first(context: str, frames: str, figures: list, quoted: str, source: str) -> Diagnosis | None:
    """An OOM inside an attention computation (its frames in the traceback), or a diffusion model's generation at a
    large resolution or under a web UI's chunked cross-attention, with no memory-efficient kernel on: eager attention
    holds batch x heads x tokens x tokens scores (a 1000 px image is 125 x 125 = 15,625 latent tokens in SD's UNet,
    about 0.5 GB of scores per head at 16 bits), which xformers, SDPA or flash attention never materialise."""
    if _KERNEL_ON.search(context):
        return None
    in_attention = bool(_ATTENTION_FRAMES.search(frames))
    generating = image_generation(context)
    large = _largest_side(context) >= LARGE_SIDE
    if not (in_attention or (generating and (large or _UI_CROSS_ATTENTION.search(context)))):
        return None
    changes = [_kernel_change(context)]
    if generating:
        changes.append(Change("lower the image resolution (width x height) or the batch size (images per batch)",
                              "the latent pixels, and with them the attention, shrink with the image",
                              "image_resolution_down"))
        if _NO_HALF.search(context):
            changes.append(Change("drop --no-half (the model then runs in half precision)", "halves the weights' "
                                  "and activations' bytes", "half_precision"))
    else:
        changes.append(Change("lower the batch size or the sequence length (image size for a vision model)",
                              "the scores grow with the batch and the square of the length", "batch_size_down"))
    return Diagnosis(source, "pytorch-oom", "activation_peak",
                     "the attention ran out: eager attention holds every score (tokens x tokens per head, for an "
                     "image its latent pixels squared), which a memory-efficient kernel never materialises",
                     tuple(figures), tuple(changes), failing_line=quoted)


NATIVE_SIDE = 512  # px: Stable Diffusion 1.x's own resolution; below it the image has nothing left to give
_ONE_IMAGE = re.compile(r"\b1 batch\b|\bbatch[ _-]?(?:size|count)\W{0,3}1\b|\bone image\b|\bn_?iter\W{0,3}1\b",
                        re.I)
# the UI's own low-memory modes, on or said tried: they keep the model's parts in CPU memory and move each in when used
_LOW_VRAM = re.compile(r"-{1,2}(?:low|no)vram\b|\blow ?vram mode\b", re.I)


def _low_vram_mode_failed(side: int, figures: list, quoted: str, source: str) -> Diagnosis:
    """One image at or below the model's native size, in the UI's low-VRAM mode, and still out of memory: the image
    and the batch have nothing left to give, and the mode exists to keep the model's parts off the GPU, so it is not
    doing so: a release of the UI whose model management does comes first, a smaller checkpoint second."""
    return Diagnosis(source, "pytorch-oom", "activation_peak",
                     f"one image at {side} px in the UI's low-VRAM mode ran out: neither the image nor the batch can "
                     "shrink further, and the mode that should keep the model in CPU memory did not", tuple(figures), (
                         Change("upgrade the UI (ComfyUI / the web UI) to a release whose low-VRAM model management "
                                "offloads the model on this card", "the weights then wait in CPU memory and only the "
                                "part in use is on the GPU", "upgrade"),
                         Change("a pruned half-precision checkpoint (an fp16 '-pruned' .safetensors)",
                                "half the bytes of an fp32 checkpoint with EMA weights", "quantize_smaller"),
                         Change("free the GPU of other programs (a laptop's display, a browser)",
                                "what other programs hold on the card is not there for the model", "free_other_process")),
                     failing_line=quoted)


def image_generation_step(context: str, figures: list, quoted: str, source: str) -> Diagnosis | None:
    """A diffusion model's generation that ran out with nothing placing it in attention: the image's size and the
    batch are what its activations grow with; --no-half (fp32) doubles them where it is set."""
    if not image_generation(context):
        return None
    side = _largest_side(context)
    if 0 < side <= NATIVE_SIDE and _ONE_IMAGE.search(context) and _LOW_VRAM.search(context):
        return _low_vram_mode_failed(side, figures, quoted, source)
    changes = []
    if _NO_HALF.search(context):
        changes.append(Change("drop --no-half (the model then runs in half precision)", "halves the weights' and "
                              "activations' bytes", "half_precision"))
    changes.append(Change("lower the image resolution (width x height) or the batch size (images per batch)",
                          "activations grow with the pixels and the images at once", "image_resolution_down"))
    if not _KERNEL_ON.search(context):
        changes.append(_kernel_change(context))
    return Diagnosis(source, "pytorch-oom", "activation_peak",
                     "an image generation ran out: its activations grow with the image's pixels and the batch",
                     tuple(figures), tuple(changes), failing_line=quoted)


# flex attention named (a trainer's backend line, PyTorch's module) and the warning PyTorch prints when it runs eagerly
# (torch/nn/attention/flex_attention.py: "flex_attention called without torch.compile() - this will use an unfused
# implementation that materializes the full scores matrix")
_FLEX = re.compile(r"flex[-_ ]?attn|flex[-_ ]?attention|attention backend\W{0,3}flex", re.I)
_FLEX_EAGER_WARNING = re.compile(r"flex_attention called without torch\.compile", re.I)
_COMPILE_OFF = re.compile(r"compile(?:_model)?\W{0,3}(?:=|:|\s)\s*(?:false|0|off|no)\b|--no[-_]compile\b", re.I)


def flex_uncompiled(context: str, figures: list, quoted: str, source: str) -> Diagnosis | None:
    """Flex attention run without torch.compile: PyTorch then uses its unfused reference implementation, which
    materialises the full scores matrix; compiled, it is a fused kernel that never does."""
    if not _FLEX.search(context) or not (_FLEX_EAGER_WARNING.search(context) or _COMPILE_OFF.search(context)):
        return None
    return Diagnosis(source, "pytorch-oom", "activation_peak",
                     "flex attention ran without torch.compile: its unfused implementation materialises the full "
                     "scores matrix (length x length per head)", tuple(figures), (
                         Change("compile flex attention (torch.compile(flex_attention), or the trainer's "
                                "compile option on: compile_model=true)", "a fused kernel: no full scores matrix is "
                                "held", "attention_kernel"),
                         Change("lower the batch size or the sequence length", "the scores grow with the batch and "
                                "the square of the length", "batch_size_down")),
                     failing_line=quoted)


# a vision network's step (detection, segmentation, pose, classification of images): its size is images x pixels
_VISION_NETWORK = re.compile(r"\byolo\w*|detect(?:or|ion)|segment(?:ation|or)?\b|mmseg|mmdet|detectron|\bcrop[-_ ]?size|"
                             r"\bimg[-_ ]?size|\bimgsz\b|\bpose\b|\bresnet|\bunet\b|deeplab|\bvoc\b|cityscapes|coco\b",
                             re.I)


def step_change(context: str) -> Change:
    """The tokens of one step, in the model's own terms: images and their resolution for a vision network or an
    image generator, batch x sequence length otherwise."""
    if _VISION_NETWORK.search(context) or image_generation(context):
        return Change("lower the batch size (images per step), or the input resolution / crop size",
                      "activations grow with the images and their pixels", "batch_size_down")
    return Change("lower the tokens per step (batch x sequence length)", "activations grow with both",
                  "batch_size_down")
