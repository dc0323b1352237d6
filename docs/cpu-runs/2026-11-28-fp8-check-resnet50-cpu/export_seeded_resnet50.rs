fn main() {
    let dict = gpukit_models::weights::seeded_init(gpukit_models::ResNet::R50, 1000, 1, true);
    let folded = gpukit_models::forward::fold(&dict).unwrap();
    std::fs::write("/tmp/r50/resnet50.onnx", gpukit_models::onnx::export_resnet(&folded)).unwrap();
}
