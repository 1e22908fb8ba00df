"""NeMo Curator pipelines on Conveyor: replace ``nemo_curator`` by ``conveyor.curator`` in
the import lines, and nothing else.

The modules mirror NeMo Curator's layout: ``stages.base`` (``ProcessingStage``,
``CompositeStage``; also ``stages.core``), ``stages.resources`` (``Resources``),
``stages.function_definitions`` (``processing_stage``), ``tasks`` (``Task``,
``DocumentBatch``, ``FileGroupTask``, ``EmptyTask``, ``VideoTask``), ``pipeline``
(``Pipeline``), ``backends.xenna`` (``XennaExecutor``: Conveyor's streaming engine),
``backends.ray_data`` (``RayDataExecutor``), ``backends.ray_actor_pool``
(``RayActorPoolExecutor``), ``backends.base`` (``WorkerMetadata``, ``NodeInfo``) and
``core.client`` (``RayClient``). The
porting guide, with what differs and why, is docs/curator.md.
"""
