import sys

from keda_llm_scaler.cli import main

sys.exit(main())
