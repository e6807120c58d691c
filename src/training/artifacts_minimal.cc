// Artifact generation in the minimal build: not there (no autodiff). The public entry points
// (onnxtrain/artifacts.h, and through them the C API's ot_generate_artifacts) say so by name.
#include "onnxtrain/artifacts.h"
#include "onnxtrain/status.h"

namespace onnxtrain {

ArtifactPaths generate_artifacts(const std::string& model_path, const ArtifactOptions&) {
  OT_THROW(kNotImplemented, "generate_artifacts('", model_path,
           "'): artifact generation is not part of the minimal runtime (-DONNXTRAIN_MINIMAL=ON); generate the "
           "artifacts with a full build (`onnxtrain artifacts`, or Python's onnxtrain.artifacts) and copy them over");
}

}  // namespace onnxtrain
