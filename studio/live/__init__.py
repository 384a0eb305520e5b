"""Live mode around the streaming engine (:mod:`studio.render.stream`): where live audio
comes from (files played as live, raw PCM on stdin or a socket, a microphone, a browser) and
where the frames go (an MP4 recording, a browser over WebRTC, a virtual camera)."""
