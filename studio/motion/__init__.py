"""Motion: the LMDM condition and windows, the fast DDIM step on the device, the cadence plan,
kinematic smoothing and keypoint stitching."""
