# SPDX-License-Identifier: Apache-2.0
# layer_rules.cmake - which layers of src/ each layer may include (read by
# layers.cmake, which builds them, and check_layers.cmake, which checks them).
# An entry with a "/" is one header of a layer rather than the whole layer.
set(FERRY_LAYERS common format io gpu file xfer resid keep)
set(FERRY_SEES_common "")
set(FERRY_SEES_format common)
set(FERRY_SEES_io common)
set(FERRY_SEES_gpu common)
set(FERRY_SEES_file common io format)
set(FERRY_SEES_xfer common io gpu format file)
set(FERRY_SEES_resid common io xfer/xfer.h)
set(FERRY_SEES_keep common io)
