"""The configuration: SmartStage's flags in both spellings, and tf.errors codes.

    options      options_from_config(config) -> SmartStageOptions; enable_smart_stage; to_session_config
    deeprec      ConfigProto: TensorFlow's own schema with DeepRec's SmartStage fields added
    error_codes  error_codes((tf.errors.OutOfRangeError,), what) -> [11]
    renamed      the old spellings of renamed options: accepted for one release, one FutureWarning each

Import the names from their module (`from smartstage.config.options import SmartStageOptions`).
"""
