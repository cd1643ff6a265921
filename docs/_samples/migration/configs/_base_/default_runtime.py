# Logging and checkpoints, as 0.x codebases write them.
checkpoint_config = dict(interval=1)
log_config = dict(interval=50, hooks=[dict(type='TextLoggerHook')])
workflow = [('train', 1)]
