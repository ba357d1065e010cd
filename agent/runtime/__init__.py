"""The torch side of Drover: a model written for one device, tensor and
pipeline parallelism applied to it, workers that follow any plan and switch
plans live."""
