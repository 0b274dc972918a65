// How EluGradV2 walks strided views: the three views with their dims merged, so that the vector
// kernel runs on whole contiguous rows where the views have them.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace gk {

struct EluGradV2Layout {
  gkTensor dy, x, y;  // the views, same data, with as few dims as their strides allow
  // Elements per contiguous row: the innermost merged dim when every view has unit stride there,
  // else 1.
  int64_t row_elems = 1;
};

// Dims of size 1 are dropped, and dim d is merged into d + 1 where every view steps over d + 1
// exactly (stride[d] == stride[d + 1] * dims[d + 1]). The views must have the same shape.
inline EluGradV2Layout MergeEluGradV2Dims(const gkTensor& dy, const gkTensor& x, const gkTensor& y) {
  EluGradV2Layout layout{dy, x, y};
  gkTensor* views[3] = {&layout.dy, &layout.x, &layout.y};
  bool empty = false;
  for (int d = 0; d < dy.ndims; ++d) empty = empty || dy.dims[d] == 0;
  if (empty) {  // nothing to walk; the other dims may multiply past int64 (checks allow it)
    for (gkTensor* v : views) {
      v->ndims = 1;
      v->dims[0] = 0;
      v->strides[0] = 1;
    }
    return layout;
  }
  for (gkTensor* v : views) v->ndims = 0;
  // Outermost to innermost, appending each kept dim or merging it into the last one kept.
  for (int d = 0; d < dy.ndims; ++d) {
    if (dy.dims[d] == 1) continue;
    const gkTensor* sources[3] = {&dy, &x, &y};
    bool mergeable = layout.dy.ndims > 0;
    for (int t = 0; t < 3 && mergeable; ++t) {
      const gkTensor& m = *views[t];
      int64_t step;  // the stride the merged dim needs: stride[d] * dims[d] == stride[last]
      mergeable = !__builtin_mul_overflow(sources[t]->strides[d], sources[t]->dims[d], &step) &&
                  step == m.strides[m.ndims - 1];
    }
    for (int t = 0; t < 3; ++t) {
      gkTensor& m = *views[t];
      if (mergeable) {
        m.dims[m.ndims - 1] *= sources[t]->dims[d];
        m.strides[m.ndims - 1] = sources[t]->strides[d];
      } else {
        m.dims[m.ndims] = sources[t]->dims[d];
        m.strides[m.ndims] = sources[t]->strides[d];
        ++m.ndims;
      }
    }
  }
  if (layout.dy.ndims == 0) {  // one element (or every dim of size 1)
    for (gkTensor* v : views) {
      v->ndims = 1;
      v->dims[0] = 1;
      v->strides[0] = 1;
    }
  }
  const int inner = layout.dy.ndims - 1;
  if (layout.dy.strides[inner] == 1 && layout.x.strides[inner] == 1 &&
      layout.y.strides[inner] == 1) {
    layout.row_elems = layout.dy.dims[inner];
  }
  return layout;
}

}  // namespace gk
