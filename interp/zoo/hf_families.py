"""The dense families' converters under their old module name; each now lives in its own file of the family
layer (:mod:`interp.families`), and this module only re-exports them."""

from __future__ import annotations

from ..families.arcee import arcee_config, arcee_state_dict
from ..families.cohere import cohere_config, cohere_state_dict_for
from ..families.ernie4_5 import ernie4_5_config, ernie4_5_state_dict
from ..families.exaone4 import exaone4_config
from ..families.falcon import falcon_config, falcon_state_dict
from ..families.gemma import gemma_config, gemma_state_dict
from ..families.glm4 import glm4_config, glm4_state_dict
from ..families.gpt_bigcode import gpt_bigcode_config, gpt_bigcode_state_dict
from ..families.gpt_neox import gpt_neox_config, gpt_neox_state_dict
from ..families.gptj import gptj_config, gptj_state_dict
from ..families.granite import granite_config, granite_state_dict_for
from ..families.hunyuan import hunyuan_config, hunyuan_state_dict
from ..families.olmo import olmo_config, olmo_state_dict
from ..families.olmo2 import olmo2_config, olmo2_state_dict
from ..families.opt import opt_config, opt_state_dict_for
from ..families.phi import phi_config, phi_state_dict
from ..families.phi3 import phi3_config, phi3_state_dict
from ..families.smollm3 import smollm3_config
from ..families.stablelm import stablelm_config, stablelm_state_dict
from ..families.starcoder2 import starcoder2_config, starcoder2_state_dict

__all__ = ["arcee_config", "arcee_state_dict", "cohere_config", "cohere_state_dict_for", "ernie4_5_config",
           "ernie4_5_state_dict", "exaone4_config", "falcon_config", "falcon_state_dict", "gemma_config",
           "gemma_state_dict", "glm4_config", "glm4_state_dict", "gpt_bigcode_config", "gpt_bigcode_state_dict",
           "gpt_neox_config", "gpt_neox_state_dict", "gptj_config", "gptj_state_dict", "granite_config",
           "granite_state_dict_for", "hunyuan_config", "hunyuan_state_dict", "olmo2_config", "olmo2_state_dict",
           "olmo_config", "olmo_state_dict", "opt_config", "opt_state_dict_for", "phi3_config", "phi3_state_dict",
           "phi_config", "phi_state_dict", "smollm3_config", "stablelm_config", "stablelm_state_dict",
           "starcoder2_config", "starcoder2_state_dict"]
