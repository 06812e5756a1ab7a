"""The processor of the random Kimi-K2.5 stand-in (random_deepseek.py --wrapper), remote code.

SGLang serves `KimiK25ForConditionalGeneration` as a multimodal model whatever the request
holds: its tokenizer manager loads the folder's processor (AutoProcessor, trust_remote_code) and
reads `processor.media_processor.media_proc_cfg`, as Kimi-K2.5's own processor code provides.
This one gives SGLang those fields and the folder's tokenizer; the folder has no vision
weights, so it refuses images.
"""

from transformers import AutoTokenizer, BaseImageProcessor, ProcessorMixin

# the fields SGLang 0.5.17 reads (multimodal/processors/kimi_k25.py), at MoonViT's values
MEDIA_PROC_CFG = {
    "patch_size": 14,
    "merge_kernel_size": 2,
    "in_patch_limit": 16384,
    "patch_limit_on_one_side": 512,
    "fixed_output_tokens": None,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


class KimiRandomImageProcessor(BaseImageProcessor):
    model_input_names = ["pixel_values", "grid_thws"]

    def __init__(self, media_proc_cfg: dict | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.media_proc_cfg = dict(MEDIA_PROC_CFG, **(media_proc_cfg or {}))

    def preprocess(self, images, **kwargs):
        raise ValueError("this random-weight Kimi-K2.5 stand-in has no vision weights: text only")


class KimiRandomProcessor(ProcessorMixin):
    attributes = ["image_processor", "tokenizer"]
    image_processor_class = "AutoImageProcessor"
    tokenizer_class = "AutoTokenizer"

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, chat_template=chat_template)

    @property
    def media_processor(self) -> KimiRandomImageProcessor:
        return self.image_processor

    def __call__(self, text=None, images=None, **kwargs):
        if images:
            self.image_processor.preprocess(images)
        return self.tokenizer(text, **kwargs)

    @classmethod
    def from_pretrained(cls, folder, **kwargs):
        # the two parts from the folder itself: the image processor is this module's class
        kwargs.pop("use_fast", None)
        trust = kwargs.pop("trust_remote_code", False)
        image_processor = KimiRandomImageProcessor.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust)
        return cls(image_processor, tokenizer)
