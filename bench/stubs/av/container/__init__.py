# SPDX-License-Identifier: Apache-2.0
"""av.container stand-in: the type comfy_api's video types annotate with."""
from av import _placeholder

InputContainer = _placeholder("InputContainer")
OutputContainer = _placeholder("OutputContainer")
